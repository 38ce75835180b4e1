"""``TrustAdmin``, the middle layer of the ``Registry`` service: signing (docs/registry.md,
"Signed adapters"): each tenant's trust policy and anchors, which of its adapters serve signed
revisions, and a stored revision re-checked against today's policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from loraplex.artifacts.signature import AnchorKind
from loraplex.registry import stored_signature, tenancy, trust
from loraplex.registry.service_base import RegistryBase
from loraplex.registry.sql import trust as trust_rows
from loraplex.registry.trust_models import PolicyKind, TrustAnchor, TrustPolicy


class TrustAdmin(RegistryBase):
    """Who may sign a tenant's adapters, and what was signed."""

    def trust_policy(self, tenant: str) -> TrustPolicy:
        with self._db.transaction(write=False) as tx:
            tenancy.require_tenant(tx, tenant)
            return trust_rows.get_policy(tx, tenant)

    def set_trust_policy(
        self, tenant: str, kind: PolicyKind, identities: Sequence[str], actor: str
    ) -> TrustPolicy:
        """Takes effect at the next registration; registered revisions keep their record."""
        now = self._wall_clock()
        return trust.set_policy(self._db, tenant, kind, identities, actor=actor, now=now)

    def trust_anchors(self, tenant: str) -> list[TrustAnchor]:
        with self._db.transaction(write=False) as tx:
            tenancy.require_tenant(tx, tenant)
            return trust_rows.list_anchors(tx, tenant)

    def add_trust_anchor(
        self, tenant: str, name: str, kind: AnchorKind, pem: str, actor: str
    ) -> TrustAnchor:
        """Refused (``RegistryError`` naming ``max_trust_anchors``) past the tenant's limit."""
        now = self._wall_clock()
        most = self._max_trust_anchors
        return trust.add_anchor(
            self._db, tenant, name, kind, pem, actor=actor, now=now, max_anchors=most
        )

    def remove_trust_anchor(self, tenant: str, name: str, actor: str) -> TrustAnchor:
        now = self._wall_clock()
        return trust.remove_anchor(self._db, tenant, name, actor=actor, now=now)

    def signed_adapters(self, tenant: str, names: Sequence[str] | None = None) -> dict[str, bool]:
        """``tenant``'s adapter names (or only ``names``) -> whether what their alias serves is
        signed (the owner's "signed: yes/no" in the model listing; never shown to other
        tenants)."""
        with self._db.transaction(write=False, serving=True) as tx:
            return trust_rows.signed_adapters(tx, tenant, names)

    def verify_revision(self, ref: str, actor: str) -> stored_signature.VerifyReport:
        """Re-check a stored revision against today's policy and anchors (changes nothing)."""
        revision = self.get_revision(ref)
        now = self._wall_clock()
        return stored_signature.reverify(self._db, self._store, revision, actor=actor, now=now)
