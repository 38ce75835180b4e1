"""Resolution: the one place where a tenant's model string becomes an adapter revision.

Accepted model strings: ``name`` (the caller's own adapter), ``tenant/name`` (an adapter the
caller may use: its own, or another tenant's public one), each optionally pinned with
``@revision`` (another tenant's only to a revision served now, ``_shared_pin_allowed``: one its
alias serves, or its release's candidate while in canary). Without a pin the adapter's alias
picks a revision by weight, per request, or per caller when the caller names itself
(``session_key``: its ``user`` or ``X-Session-Id``); while the alias's release is in canary, a
sticky share of callers (by ``sticky_key``) gets the candidate instead (``sticky_unit``).

NOTE: the alias's draw is sticky for a caller that names itself for the canary's sake: while it
was per request, a non-owner sending one ``user`` again and again saw a canary's candidate
answer every time or never, and a weighted alias's revisions alternate, which told it that the
owner had a release under way.

NOTE: every "you cannot have this" outcome raises ``AdapterNotFoundError`` with the same message
built from the model string alone, so another tenant's private adapter is indistinguishable from
a nonexistent one (malformed strings included). The two also take the same path: one statement
that filters by visibility, then the same raise (a test traces both).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from loraplex.errors import AdapterNotFoundError, BaseModelMismatchError, quoted
from loraplex.registry.models import Alias, AliasTarget, Revision, RevisionState
from loraplex.registry.sql import adapters as rows
from loraplex.registry.sql import releases as release_rows
from loraplex.registry.sql.db import Tx

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_MODEL_STRING = re.compile(rf"(?:({_NAME})/)?({_NAME})(?:@({_NAME}))?")


@dataclass(frozen=True)
class ModelRef:
    """A parsed model string."""

    owner: str | None  # explicit owning tenant; None means the caller's own adapter
    name: str  # adapter name
    revision: str | None  # pinned revision; None means "through the alias"


def parse_model_string(text: str) -> ModelRef | None:
    """``[tenant/]name[@revision]``; None when ``text`` is not of that form."""
    match = _MODEL_STRING.fullmatch(text)
    if match is None:
        return None
    owner, name, revision = match.groups()
    return ModelRef(owner=owner, name=name, revision=revision)


def not_found(text: str) -> AdapterNotFoundError:
    return AdapterNotFoundError(f"model {quoted(text)} does not name an adapter available to you")


def unit_from_request_id(request_id: str) -> float:
    """A uniform number in [0, 1) fixed by the request id (stable across workers and retries)."""
    digest = hashlib.sha256(request_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:7], "big") / float(1 << 56)


def choose_target(targets: tuple[AliasTarget, ...], unit: float) -> AliasTarget:
    """The target whose cumulative weight band contains ``unit`` (in [0, 1))."""
    if not 0.0 <= unit < 1.0:
        raise ValueError(f"unit {unit} is invalid; expected 0 <= unit < 1")
    total = sum(target.weight for target in targets)
    point = unit * total
    for target in targets:
        if point < target.weight:
            return target
        point -= target.weight
    return targets[-1]


def resolve_in(
    tx: Tx,
    caller: str,
    text: str,
    base_digest: str | None,
    unit: float,
    *,
    sticky_key: str | None = None,
    session_key: str | None = None,
) -> Revision:
    """Resolve ``text`` for ``caller`` inside ``tx``; see the module docstring. ``sticky_key``
    assigns the caller to a release's canary or not (the same key, the same side);
    ``session_key`` (the caller's own ``user`` or session id; None: the caller named none) makes
    the alias's weighted draw the same for each of its requests too."""
    ref = parse_model_string(text)
    if ref is None:
        raise not_found(text)
    owner = ref.owner or caller
    if rows.get_usable_adapter(tx, caller, owner, ref.name) is None:
        raise not_found(text)
    if ref.revision is not None:
        shared = owner != caller  # checked first: one path for unserved and unknown labels
        if shared and not _shared_pin_allowed(tx, owner, ref.name, ref.revision, base_digest):
            raise not_found(text)
        pinned = rows.get_revision(tx, owner, ref.name, ref.revision)
        if pinned is None:
            raise not_found(text)
        _check_base(pinned, base_digest)
        return pinned
    canary = _canary_pick(tx, owner, ref.name, base_digest, unit=unit, sticky_key=sticky_key)
    if canary is not None:
        return canary
    alias = rows.get_alias(tx, owner, ref.name)
    servable = [] if alias is None else _servable(tx, alias, base_digest)
    if not servable:
        raise not_found(text)
    if session_key is not None:
        unit = sticky_unit(f"alias\x00{owner}/{ref.name}", session_key)
    chosen = choose_target(tuple(target for target, _ in servable), unit)
    return next(rev for target, rev in servable if target is chosen)


def sticky_unit(release_id: str, sticky_key: str) -> float:
    """A uniform number in [0, 1) fixed by (release, caller): the caller is on the candidate
    iff it is below the step's share, so raising the share only adds callers."""
    return unit_from_request_id(f"{release_id}\x00{sticky_key}")


def _canary_pick(
    tx: Tx, owner: str, name: str, base_digest: str | None, *, unit: float, sticky_key: str | None
) -> Revision | None:
    """The candidate when the alias's release is in canary and this caller falls in its share;
    None sends the request through the alias (which still names the stable revision)."""
    route = _serving_canary(tx, owner, name, base_digest)
    if route is None:
        return None
    drawn = unit if sticky_key is None else sticky_unit(route.release_id, sticky_key)
    return route.candidate if drawn < route.share else None


def _serving_canary(
    tx: Tx, owner: str, name: str, base_digest: str | None
) -> release_rows.CanaryRoute | None:
    """The alias's release while in canary with a candidate that may serve; else None."""
    route = release_rows.canary_route(tx, owner, name)
    if route is None:
        return None
    candidate = route.candidate
    if candidate.state is RevisionState.DEPRECATED:
        return None
    if base_digest is not None and candidate.base_digest != base_digest:
        return None
    return route


def _shared_pin_allowed(tx: Tx, owner: str, name: str, label: str, base_digest: str | None) -> bool:
    """Whether another tenant may pin revision ``label`` of ``owner/name``: one that adapter
    serves now, through its alias or as its release's canary candidate. NOTE: every cached copy
    is charged to the revision's owner (its tier share, its loads in flight), so a tenant pinning
    each revision of another's public adapter in turn evicted the owner's own adapters from its
    share of the GPU slots. NOTE: the candidate is served to callers in the canary's share, who
    learn its label; refused to them as a pin, the 404 told them it was not the alias's revision,
    i.e. that a release was under way. Now it pins like any served revision, for every caller
    (a caller outside the share pinning it is one voice in the release, ``release/callers.py``),
    and once the canary ends it is the unknown model's 404 again."""
    route = _serving_canary(tx, owner, name, base_digest)
    if route is not None and route.candidate.revision == label:
        return True
    alias = rows.get_alias(tx, owner, name)
    if alias is None:
        return False
    return any(rev.revision == label for _, rev in _servable(tx, alias, base_digest))


def _servable(tx: Tx, alias: Alias, base_digest: str | None) -> list[tuple[AliasTarget, Revision]]:
    """Alias targets that may serve: not deprecated, and built for the served base model."""
    found = []
    for target in alias.targets:
        rev = rows.get_revision(tx, alias.tenant, alias.name, target.revision)
        if rev is None or rev.state is RevisionState.DEPRECATED:
            continue
        if base_digest is not None and rev.base_digest != base_digest:
            continue
        found.append((target, rev))
    return found


def _check_base(rev: Revision, base_digest: str | None) -> None:
    if base_digest is not None and rev.base_digest != base_digest:
        raise BaseModelMismatchError(
            f"{rev.ref} was registered for base model {rev.base_digest}; "
            f"this server serves {base_digest}"
        )
