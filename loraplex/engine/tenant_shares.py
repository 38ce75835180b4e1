"""Per-tenant shares of the engine and the adapter cache (torch-free).

The registry says what a tenant is entitled to (a priority class and quotas); this module turns
that into what the engine enforces. One ``TenantBook`` is shared by the scheduler (fair-share
weights, class seat caps and the cold-load quota) and the cache wiring (priority and byte
budgets), and is replaced as a whole when an operator changes a tenant, so a change takes effect
at the next step without a restart.

Priority class -> weight (``PRIORITY_WEIGHTS``): ``high`` 4, ``normal`` 1, ``batch`` 0.25. The
same weight is the scheduler's fair share (a high tenant gets 16x the tokens of a batch tenant
when both are backlogged) and the cache's keep-priority (the cost_aware policy multiplies an
adapter's keep-score by it, so a batch tenant's adapters are evicted first). It also weighs the
tenant's fair share of the engine's seats (``engine/sched/seats.py``), which its
``max_running_seqs`` / ``reserved_running_seqs`` / ``max_kv_blocks`` bound.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

PRIORITY_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"high": 4.0, "normal": 1.0, "batch": 0.25}
)


@dataclass(frozen=True)
class TenantSettings:
    """One tenant's weight and quotas, as the engine and the cache enforce them."""

    weight: float = 1.0  # fair share and cache keep-priority (PRIORITY_WEIGHTS of its class)
    max_gpu_bytes: int | None = None  # adapter bytes in GPU slots (L0); None: no cap
    max_cpu_bytes: int | None = None  # adapter bytes in host memory (L1); None: no cap
    max_disk_bytes: int | None = None  # adapter bytes in the disk cache (L2); None: no cap
    max_cold_loads: int | None = None  # adapter loads the engine starts at once; None: no cap
    max_running_seqs: int | None = None  # running sequences (seats) at most; None: no cap
    reserved_running_seqs: int = 0  # seats handed to it before any fair share (see sched/seats)
    max_kv_blocks: int | None = None  # KV blocks its running sequences hold; None: no cap

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"weight {self.weight} is invalid; expected > 0")
        for name in ("max_gpu_bytes", "max_cpu_bytes", "max_disk_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} {value} is invalid; expected None or >= 0")
        if self.max_cold_loads is not None and self.max_cold_loads < 1:
            raise ValueError(
                f"max_cold_loads {self.max_cold_loads} is invalid; expected None or >= 1"
            )
        check_seats(self.max_running_seqs, self.reserved_running_seqs, self.max_kv_blocks)

    @classmethod
    def for_priority(
        cls,
        priority: str,
        *,
        max_gpu_bytes: int | None = None,
        max_cpu_bytes: int | None = None,
        max_disk_bytes: int | None = None,
        max_cold_loads: int | None = None,
        seats: SeatLimits | None = None,
    ) -> TenantSettings:
        """Settings of a tenant of priority class ``priority`` (high, normal or batch)."""
        weight = PRIORITY_WEIGHTS.get(priority)
        if weight is None:
            raise ValueError(
                f"priority {priority!r} is invalid; expected one of {sorted(PRIORITY_WEIGHTS)}"
            )
        s = seats or SeatLimits()
        return cls(
            weight,
            max_gpu_bytes,
            max_cpu_bytes,
            max_disk_bytes,
            max_cold_loads,
            s.max_running_seqs,
            s.reserved_running_seqs,
            s.max_kv_blocks,
        )


@dataclass(frozen=True)
class SeatLimits:
    """A tenant's running-sequence and KV-block limits (the registry's quotas of the same names)."""

    max_running_seqs: int | None = None  # seats at most; None: its fair share, or all when alone
    reserved_running_seqs: int = 0  # seats it gets before anyone's fair share
    max_kv_blocks: int | None = None  # KV blocks at most; None: no cap

    def __post_init__(self) -> None:
        check_seats(self.max_running_seqs, self.reserved_running_seqs, self.max_kv_blocks)


def check_seats(max_running_seqs: int | None, reserved: int, max_kv_blocks: int | None) -> None:
    """Raises ValueError naming the first invalid seat limit."""
    if max_running_seqs is not None and max_running_seqs < 1:
        raise ValueError(
            f"max_running_seqs {max_running_seqs} is invalid; expected None or an int >= 1"
        )
    if reserved < 0:
        raise ValueError(f"reserved_running_seqs {reserved} is invalid; expected an int >= 0")
    if max_running_seqs is not None and reserved > max_running_seqs:
        raise ValueError(
            f"reserved_running_seqs {reserved} is invalid; expected <= max_running_seqs "
            f"{max_running_seqs}"
        )
    if max_kv_blocks is not None and max_kv_blocks < 1:
        raise ValueError(f"max_kv_blocks {max_kv_blocks} is invalid; expected None or an int >= 1")


_DEFAULT = TenantSettings()


class TenantBook:
    """The current settings of every known tenant; unknown tenants get the defaults.

    Readers (the engine thread) and the writer (an admin request) never see a half-applied
    update: ``replace`` swaps one immutable mapping.
    """

    def __init__(self, settings: Mapping[str, TenantSettings] | None = None) -> None:
        self._lock = threading.Lock()
        self._settings: Mapping[str, TenantSettings] = MappingProxyType(dict(settings or {}))

    def get(self, tenant: str) -> TenantSettings:
        return self._settings.get(tenant, _DEFAULT)

    def weight(self, tenant: str) -> float:
        return self.get(tenant).weight

    def max_cold_loads(self, tenant: str) -> int | None:
        return self.get(tenant).max_cold_loads

    def snapshot(self) -> Mapping[str, TenantSettings]:
        return self._settings

    def replace(self, settings: Mapping[str, TenantSettings]) -> None:
        with self._lock:
            self._settings = MappingProxyType(dict(settings))
