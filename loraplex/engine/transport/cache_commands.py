"""Cache and merge-hold commands run on an engine's own cache and holds: the engine child
(``child_loop.py``) and a fleet's engine replica (``fleet/replica.py``) run them this one way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loraplex.engine.merge_holds import MergeHolds
from loraplex.engine.transport.messages import (
    CacheCommand,
    Dedicate,
    DropAutoWarm,
    Evict,
    HoldMerges,
    Holds,
    Pin,
    Prefetch,
    SetWarm,
    Snapshot,
    Unpin,
)
from loraplex.residency.cache import TieredAdapterCache

# How each cache command runs on the child's cache (UpdateTenants runs on the handles instead).
_CACHE_COMMANDS: dict[type[CacheCommand], Callable[[TieredAdapterCache, Any], Any]] = {
    Snapshot: lambda cache, c: cache.snapshot(),
    Pin: lambda cache, c: cache.pin(c.key, c.tier),
    Prefetch: lambda cache, c: cache.prefetch(c.key, c.tier),
    Unpin: lambda cache, c: cache.unpin(c.key, c.tier),
    Evict: lambda cache, c: cache.evict(c.key, c.tier),
    Holds: lambda cache, c: cache.holds(c.key, c.tier),
    SetWarm: lambda cache, c: cache.set_warm_policy(c.key, c.warm),
    DropAutoWarm: lambda cache, c: cache.drop_auto_warm(c.key),
}


def run_cache_command(cache: TieredAdapterCache, command: CacheCommand) -> Any:
    """``command`` run on ``cache`` (a loading command returns its load's Future); the engine
    child and a fleet's engine replica run cache calls this one way."""
    return _CACHE_COMMANDS[type(command)](cache, command)


def run_hold_command(holds: MergeHolds, command: HoldMerges | Dedicate) -> frozenset[str]:
    """``command`` on an engine's merge holds: the refs merged now (none for a release or a
    dedication); the engine child and a fleet's engine replica run it this one way."""
    if isinstance(command, Dedicate):
        holds.dedicate(command.ref)
        return frozenset()
    if command.hold:
        return holds.hold(command.refs)
    holds.release(command.refs)
    return frozenset()
