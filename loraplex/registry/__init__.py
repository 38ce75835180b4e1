"""Control plane (torch-free): tenants, API keys, adapters, revisions, aliases, audit log, and
the artifact stores holding adapter files. ``open_registry`` is the usual entry point; see
docs/registry.md.
"""

from loraplex.artifacts.store import ArtifactStore, LocalArtifactStore
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.registry.config import RegistryConfig, default_data_dir, open_registry, open_store
from loraplex.registry.models import (
    Adapter,
    Alias,
    AliasTarget,
    ApiKeyInfo,
    AuditEntry,
    IssuedKey,
    PriorityClass,
    Provenance,
    RegistrationRequest,
    RegistrationResult,
    Revision,
    RevisionState,
    Tenant,
    TenantQuotas,
    Visibility,
)
from loraplex.registry.registry import Registry
from loraplex.registry.trust_models import PolicyKind, TrustAnchor, TrustPolicy

__all__ = [
    "Adapter",
    "Alias",
    "AliasTarget",
    "ApiKeyInfo",
    "ArtifactStore",
    "AuditEntry",
    "IssuedKey",
    "LocalArtifactStore",
    "PolicyKind",
    "PriorityClass",
    "Provenance",
    "RegistrationRequest",
    "RegistrationResult",
    "Registry",
    "RegistryConfig",
    "Revision",
    "RevisionState",
    "Tenant",
    "TenantQuotas",
    "TrustAnchor",
    "TrustPolicy",
    "Visibility",
    "WarmPolicy",
    "default_data_dir",
    "open_registry",
    "open_store",
]
