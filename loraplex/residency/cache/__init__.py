"""The tiered adapter cache: one unit that leases adapter copies to the engine and decides what
to load, keep and evict. ``TieredAdapterCache`` is the only entry point; the names below are its
configuration, its typed results and the executors it runs phases on. The other modules are
private to this package (import from here)."""

from loraplex.residency.cache.changes import ResidencyChanges
from loraplex.residency.cache.config import CacheConfig
from loraplex.residency.cache.executors import SimExecutor, StepExecutor, ThreadStepExecutor
from loraplex.residency.cache.jobs import Lease
from loraplex.residency.cache.tiered_cache import TieredAdapterCache
from loraplex.residency.cache.view import (
    CacheSummary,
    CopyHolds,
    EntrySnapshot,
    ResidencySnapshot,
    Unpinned,
)

__all__ = [
    "CacheConfig",
    "CacheSummary",
    "CopyHolds",
    "EntrySnapshot",
    "Lease",
    "ResidencyChanges",
    "ResidencySnapshot",
    "SimExecutor",
    "StepExecutor",
    "ThreadStepExecutor",
    "TieredAdapterCache",
    "Unpinned",
]
