"""Request bodies of the admin API."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from loraplex.errors import quoted
from loraplex.registry import (
    PriorityClass,
    RevisionState,
    TenantQuotas,
    Visibility,
    WarmPolicy,
)
from loraplex.residency.ledger import Tier

TIER_NAMES = {"L0": Tier.L0, "gpu": Tier.L0, "L1": Tier.L1, "cpu": Tier.L1, "L2": Tier.L2}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QuotasBody(_Body):
    max_gpu_bytes: int | None = None
    max_cpu_bytes: int | None = None
    max_disk_bytes: int | None = None
    max_cold_loads: int | None = None
    max_requests_per_s: float | None = None

    def quotas(self) -> TenantQuotas:
        return TenantQuotas(**self.model_dump())


class TenantBody(_Body):
    name: str
    priority: PriorityClass = PriorityClass.NORMAL
    quotas: QuotasBody = Field(default_factory=QuotasBody)


class ReleaseFields(_Body):
    state: RevisionState = RevisionState.STABLE
    warm_policy: WarmPolicy = WarmPolicy.ON_DEMAND
    visibility: Visibility = Visibility.PRIVATE
    probe_prompt: str | None = None
    expected_continuation: str | None = None


class RegisterBody(ReleaseFields):
    """Register a PEFT directory that already sits on the server, inside the import directory."""

    path: str  # relative to the configured import directory
    tenant: str
    name: str
    revision: str


class UploadFields(ReleaseFields):
    """The text fields of an upload (its files are the ``config`` and ``weights`` parts)."""

    tenant: str
    name: str
    revision: str


class ReleaseBody(_Body):
    state: RevisionState | None = None
    warm_policy: WarmPolicy | None = None


class AliasTargetBody(_Body):
    revision: str
    weight: int = 1


class AliasBody(_Body):
    targets: list[AliasTargetBody] = Field(min_length=1)


class VisibilityBody(_Body):
    visibility: Visibility


class ResidencyBody(_Body):
    """An operator action on one revision's residency."""

    model: str  # tenant/name@revision
    tier: str = "L0"  # L0 (gpu), L1 (cpu) or L2
    wait: bool = False  # answer only when the load finished

    def cache_tier(self) -> Tier:
        if self.tier not in TIER_NAMES:
            raise ValueError(
                f"tier {quoted(self.tier)} is invalid; expected one of {sorted(TIER_NAMES)}"
            )
        return TIER_NAMES[self.tier]
