"""``WarmPolicy``: how hard the adapter cache keeps a revision resident.

One enum for the registry (which records an operator's choice per revision) and the cache
(which applies it, or picks one automatically from the revision's traffic)."""

from __future__ import annotations

from enum import StrEnum


class WarmPolicy(StrEnum):
    """Where a revision is kept between requests."""

    GPU = "gpu"  # pinned in L0 (a GPU slot)
    CPU = "cpu"  # pinned in L1 (host memory)
    ON_DEMAND = "on_demand"  # loaded when requested, evicted by the eviction policy
