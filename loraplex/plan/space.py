"""What the planner sweeps: one ``Candidate`` per deployment configuration, from the axes of a
``SweepSpace`` (replicas, GPU slots, CPU and disk bytes, eviction and routing policy, merged
replicas). Policy names are checked against the real registries by the command line (the planner
sits above the simulator and below nothing that owns them)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    """One deployment the planner simulates."""

    replicas: int  # engine replicas (machines priced)
    max_loras: int  # GPU adapter slots per replica
    cpu_adapter_bytes: int  # L1 budget per replica
    disk_cache_bytes: int  # L2 budget per replica
    eviction_policy: str  # residency policy name (residency.policy)
    routing_policy: str  # router policy name (router.router); moot with one replica
    merged_replicas: int = 0  # replicas serving one hot revision merged into the base weights

    def __post_init__(self) -> None:
        for name in ("replicas", "max_loras", "cpu_adapter_bytes", "disk_cache_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Candidate.{name} {value!r} is invalid; expected an int >= 1")
        if not 0 <= self.merged_replicas <= self.replicas:
            raise ValueError(
                f"Candidate.merged_replicas {self.merged_replicas} is invalid; "
                f"expected 0..replicas ({self.replicas})"
            )
        for name in ("eviction_policy", "routing_policy"):
            if not getattr(self, name):
                raise ValueError(f"Candidate.{name} must name a policy")

    def label(self) -> str:
        """A short name for tables and plots."""
        merged = f" merged={self.merged_replicas}" if self.merged_replicas else ""
        return (
            f"r={self.replicas} slots={self.max_loras} cpu={_mib(self.cpu_adapter_bytes)} "
            f"disk={_mib(self.disk_cache_bytes)} {self.eviction_policy}/"
            f"{self.routing_policy}{merged}"
        )

    def footprint(self) -> tuple[int, int, int, int, int]:
        """Resources held, for breaking cost ties toward the smaller deployment."""
        return (
            self.replicas,
            self.merged_replicas,
            self.max_loras,
            self.cpu_adapter_bytes,
            self.disk_cache_bytes,
        )


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):g}MiB"


@dataclass(frozen=True)
class SweepSpace:
    """The axes swept; every combination is a candidate, except that with one replica only the
    first routing policy is tried (routing has nothing to choose between) and merged replicas
    never exceed the replicas."""

    replicas: tuple[int, ...] = (1, 2, 3, 4)
    max_loras: tuple[int, ...] = (4, 8, 16)
    cpu_adapter_bytes: tuple[int, ...] = (64 << 20, 256 << 20)
    disk_cache_bytes: tuple[int, ...] = (1 << 30,)
    eviction_policies: tuple[str, ...] = ("lru", "cost_aware")
    routing_policies: tuple[str, ...] = ("pow2", "affinity_until_saturated")
    merged_replicas: tuple[int, ...] = field(default=(0,))

    def __post_init__(self) -> None:
        for name in (
            "replicas",
            "max_loras",
            "cpu_adapter_bytes",
            "disk_cache_bytes",
            "eviction_policies",
            "routing_policies",
            "merged_replicas",
        ):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"SweepSpace.{name} {values!r} must be non-empty and distinct")
        if min(self.merged_replicas) < 0:
            raise ValueError(f"SweepSpace.merged_replicas {self.merged_replicas} must be >= 0")

    def candidates(self) -> Iterator[Candidate]:
        axes = itertools.product(
            self.replicas,
            self.max_loras,
            self.cpu_adapter_bytes,
            self.disk_cache_bytes,
            self.eviction_policies,
            self.routing_policies,
            self.merged_replicas,
        )
        for replicas, slots, cpu, disk, eviction, routing, merged in axes:
            if replicas == 1 and routing != self.routing_policies[0]:
                continue
            if merged > replicas:
                continue
            yield Candidate(replicas, slots, cpu, disk, eviction, routing, merged)
