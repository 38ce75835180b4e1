"""Tenant trust: policies, trust anchors, and the signature check registration runs.

What is checked when (docs/registry.md, "Signed adapters"):

- at registration, ``check_offered`` verifies the offered bundle with ``model-signing`` against
  the tenant's anchors and policy, before anything is stored;
- at every L3 -> L2 fetch, the stored bundle (pinned by digest in the revision) must sign exactly
  the stored digests (``artifacts.signature.check_covers``);
- ``reverify`` re-checks a stored revision against today's anchors and policy, changing nothing.

Removing an anchor never touches revisions verified with it: their provenance names the anchor
and the time of verification. A tenant holds at most ``max_trust_anchors`` anchors, and a check
reads only those its bundle names by key id (``find_trusted``), never every anchor's PEM.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.signature import (
    Anchor,
    AnchorKind,
    AnchorLookup,
    SignatureProblem,
    VerifiedSignature,
    anchor_ids,
    verify_dir,
)
from loraplex.errors import RecordNotFoundError, RegistryError, SignatureError, quoted
from loraplex.registry.sql import audit
from loraplex.registry.sql import trust as rows
from loraplex.registry.sql.db import Database, Tx
from loraplex.registry.tenancy import require_tenant
from loraplex.registry.trust_models import PolicyKind, TrustAnchor, TrustPolicy

DEFAULT_MAX_TRUST_ANCHORS = 16  # a tenant's anchors at most (``max_trust_anchors``)
MAX_TRUST_ANCHORS = 1000  # the most ``max_trust_anchors`` may be


def check_max_trust_anchors(value: int) -> None:
    if isinstance(value, bool) or not 1 <= value <= MAX_TRUST_ANCHORS:
        raise ValueError(
            f"max_trust_anchors {value!r} is invalid; expected an int from 1 to {MAX_TRUST_ANCHORS}"
        )


@dataclass(frozen=True)
class Trusted:
    """What a signature check reads of a tenant's anchors."""

    anchors: tuple[TrustAnchor, ...]  # those the bundle names by key id (and any without one)
    num_trusted: int  # the tenant's anchors in all


def find_trusted(tx: Tx, tenant: str, lookup: AnchorLookup | None) -> Trusted:
    """The anchors ``lookup`` names (none read without a bundle: None)."""
    if lookup is None:
        return Trusted((), 0)
    found = rows.find_anchors(tx, tenant, lookup)
    return Trusted(tuple(found), rows.count_anchors(tx, tenant))


def set_policy(
    db: Database,
    tenant: str,
    kind: PolicyKind,
    identities: Sequence[str],
    *,
    actor: str,
    now: float,
) -> TrustPolicy:
    policy = TrustPolicy(tenant, kind, tuple(identities), now)
    with db.transaction() as tx:
        require_tenant(tx, tenant)
        rows.put_policy(tx, policy, now)
        details: dict[str, object] = {"policy": kind.value, "identities": list(identities)}
        audit.append(tx, "trust.policy", tenant, details, at=now, actor=actor)
    return policy


def add_anchor(
    db: Database,
    tenant: str,
    name: str,
    kind: AnchorKind,
    pem: str,
    *,
    actor: str,
    now: float,
    max_anchors: int = DEFAULT_MAX_TRUST_ANCHORS,
) -> TrustAnchor:
    """Trust ``pem`` (an EC public key or a certificate root) for ``tenant``'s signatures;
    refused when the tenant has ``max_anchors`` already."""
    ids = anchor_ids(kind, pem)
    anchor = TrustAnchor(tenant, name, kind, pem, ids.fingerprint, now)
    with db.transaction() as tx:
        require_tenant(tx, tenant)
        if rows.get_anchor(tx, tenant, name) is not None:
            raise RegistryError(f"trust anchor {quoted(name)} of tenant {quoted(tenant)} exists")
        num_anchors = rows.count_anchors(tx, tenant)
        if num_anchors >= max_anchors:
            raise RegistryError(
                f"tenant {quoted(tenant)} has {num_anchors} trust anchors; max_trust_anchors "
                f"{max_anchors} allows no more (remove one, or raise max_trust_anchors)"
            )
        rows.insert_anchor(tx, anchor, ids.key_id)
        details: dict[str, object] = {"anchor": name, "kind": kind.value}
        details["fingerprint"] = anchor.fingerprint
        audit.append(tx, "trust.add", tenant, details, at=now, actor=actor)
    return anchor


def remove_anchor(db: Database, tenant: str, name: str, *, actor: str, now: float) -> TrustAnchor:
    """Stop trusting an anchor for new registrations; verified revisions keep their record."""
    with db.transaction() as tx:
        anchor = rows.get_anchor(tx, tenant, name)
        if anchor is None:
            raise RecordNotFoundError(
                f"trust anchor {quoted(name)} of tenant {quoted(tenant)} does not exist"
            )
        rows.delete_anchor(tx, tenant, name)
        details: dict[str, object] = {"anchor": name, "fingerprint": anchor.fingerprint}
        audit.append(tx, "trust.remove", tenant, details, at=now, actor=actor)
    return anchor


def fill_key_ids(db: Database) -> int:
    """Give anchors added before key ids (schema version 7) theirs; how many. Until then a check
    reads them with the anchors its bundle names. Without the signing extra: none (no anchor
    could have been added without it either)."""
    try:
        import cryptography  # noqa: F401  # the signing extra
    except ImportError:
        return 0
    with db.transaction(write=False) as tx:  # NOTE: no write lock on every open
        missing = rows.anchors_without_key_id(tx)
    if not missing:
        return 0
    with db.transaction() as tx:
        for anchor in missing:
            key_id = anchor_ids(anchor.kind, anchor.pem).key_id
            rows.set_key_id(tx, anchor.tenant, anchor.name, key_id)
    return len(missing)


def check_offered(
    policy: TrustPolicy,
    trusted: Trusted,
    adapter_dir: Path,
    bundle: bytes | None,
    stored: Collection[str] | None = None,
) -> VerifiedSignature | None:
    """The verified signature of ``adapter_dir`` under ``policy``; None when unsigned and allowed.
    ``stored``: the files kept of a registered revision (``verify_dir``).

    NOTE: under policy ``none`` an offered bundle is still verified (and refused when it fails):
    a signature is never silently ignored.
    """
    if bundle is None:
        if policy.kind is PolicyKind.NONE:
            return None
        raise SignatureError(
            SignatureProblem.UNSIGNED,
            f"tenant {quoted(policy.tenant)} requires signed adapters (policy "
            f"{policy.kind.value}); no signature (model.sig) was offered",
        )
    anchors = [_plain(a) for a in trusted.anchors]
    verified = verify_dir(adapter_dir, bundle, anchors, trusted.num_trusted, stored)
    if policy.kind is PolicyKind.IDENTITIES and verified.signer not in policy.identities:
        raise SignatureError(
            SignatureProblem.IDENTITY,
            f"signer {quoted(verified.signer)} is not among tenant {quoted(policy.tenant)}'s "
            f"required identities {quoted(list(policy.identities))}",
        )
    return verified


def _plain(anchor: TrustAnchor) -> Anchor:
    return Anchor(anchor.name, anchor.kind, anchor.pem)
