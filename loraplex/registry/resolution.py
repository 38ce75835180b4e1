"""Resolution: the one place where a tenant's model string becomes an adapter revision.

Accepted model strings: ``name`` (the caller's own adapter), ``tenant/name`` (an adapter the
caller may use: its own, or another tenant's public one), each optionally pinned with
``@revision`` (another tenant's only to a revision served now, ``_shared_pin_allowed``: one its
alias serves, or its release's candidate while in canary). Without a pin the adapter's alias
picks a revision by weight, per request, or per caller when the caller names itself
(``session_key``: its ``user`` or ``X-Session-Id``); while the alias's release is in canary, the
callers whose draw falls below the canary's share get the candidate instead, and the others
draw through the alias's weights (their draw spread again over [0, 1)).

NOTE: one draw serves the canary and the alias, so a canary splits callers exactly as an alias
weighting the candidate first would. The draw is per caller for a caller that names itself: while
it was per request, a non-owner sending one ``user`` again and again saw a canary's candidate
answer every time or never, and a weighted alias's revisions alternate. And it is the same for
the canary and the alias: while the canary's was salted by the release id (secret) and the
alias's by the adapter's name (which any caller can hash), a non-owner whose users' revisions did
not follow the draw it computed knew that the owner had a release under way. The cost: every
release of one adapter puts the same callers on its candidate first.

NOTE: every "you cannot have this" outcome raises ``AdapterNotFoundError`` with the same message
built from the model string alone, so another tenant's private adapter is indistinguishable from
a nonexistent one (malformed strings included). The two also take the same path: one statement
that filters by visibility, then the same raise (a test traces both). Only the owner, who knows
its adapter exists, is told what is wrong: a revision its adapter does not have, or an alias that
serves no revision (every target deprecated: it got the uniform message, while ``/v1/models``
listed the adapter).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from loraplex.errors import AdapterNotFoundError, BaseModelMismatchError, quoted
from loraplex.registry.models import Alias, AliasTarget, Revision, RevisionState
from loraplex.registry.sql import adapters as rows
from loraplex.registry.sql import releases as release_rows
from loraplex.registry.sql.db import Tx

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_MODEL_STRING = re.compile(rf"(?:({_NAME})/)?({_NAME})(?:@({_NAME}))?")
_BELOW_ONE = math.nextafter(1.0, 0.0)


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
    session_key: str | None = None,
) -> Revision:
    """Resolve ``text`` for ``caller`` inside ``tx``; see the module docstring. ``unit`` draws
    for this request; ``session_key`` (the caller's own ``user`` or session id; None: the caller
    named none) replaces it with one draw per caller and adapter, which puts the caller on one
    side of a release's canary and on one revision of the alias's weights."""
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
        if pinned is None and not shared:  # its own: naming what is wrong leaks nothing
            raise AdapterNotFoundError(
                f"model {quoted(text)}: your adapter {quoted(ref.name)} has no revision "
                f"{quoted(ref.revision)}"
            )
        if pinned is None:
            raise not_found(text)
        _check_base(pinned, base_digest)
        return pinned
    if session_key is not None:
        unit = sticky_unit(f"alias\x00{owner}/{ref.name}", session_key)
    route = _serving_canary(tx, owner, ref.name, base_digest)
    if route is not None:
        if unit < route.share:
            return route.candidate
        unit = _above(unit, route.share)
    alias = rows.get_alias(tx, owner, ref.name)
    servable = [] if alias is None else servable_targets(tx, alias, base_digest)
    if not servable and owner == caller:  # its own: naming what is wrong leaks nothing
        raise AdapterNotFoundError(
            f"model {quoted(text)}: your adapter {quoted(ref.name)} serves no revision: every "
            "revision its alias routes to is deprecated or registered for another base model; "
            "name one with @REVISION, or set the alias to one that serves "
            f"(`loraplex adapters alias set {owner}/{ref.name} REVISION`)"
        )
    if not servable:
        raise not_found(text)
    chosen = choose_target(tuple(target for target, _ in servable), unit)
    return next(rev for target, rev in servable if target is chosen)


def sticky_unit(salt: str, sticky_key: str) -> float:
    """A uniform number in [0, 1) fixed by (``salt``, caller): a caller is on a canary's
    candidate iff its draw is below the step's share, so raising the share only adds callers."""
    return unit_from_request_id(f"{salt}\x00{sticky_key}")


def _above(unit: float, share: float) -> float:
    """``unit`` (at least ``share``) spread again over [0, 1): the alias's draw among the callers
    a canary of ``share`` left to it, so its weights hold among them."""
    return min((unit - share) / (1.0 - share), _BELOW_ONE)


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
    return any(rev.revision == label for _, rev in servable_targets(tx, alias, base_digest))


def servable_targets(
    tx: Tx, alias: Alias, base_digest: str | None
) -> list[tuple[AliasTarget, Revision]]:
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
