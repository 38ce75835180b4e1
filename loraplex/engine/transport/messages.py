"""The messages between the server process and its engine child (``engine/transport/process.py``).

Every message is a frozen dataclass; each side routes what it receives through a table keyed by
the message's type (``child_loop.ChildLoop`` and ``process.EngineProcess``), and cache commands
run through one more such table in the child. Nothing is dispatched on a method name.

parent -> child: ``Build`` once, first (what to build: the child may be spawned before it is
known, and imports its heavy modules meanwhile); then ``AddRequest``, ``AbortRequest``,
``CacheCall`` (a ``CacheCommand`` with its call id), ``Stop``.

child -> parent: ``Ready`` or ``StartFailed`` once; after every engine step that produced output
one ``StepOut``; ``StatePublish`` when the queue view, the residency or the cache counters
changed (checked at most every ``state_interval_s``); ``Heartbeat`` when the engine loop sent
nothing else for ``beat_interval_s`` (the parent's progress watchdog, ``engine/watchdog.py``,
counts these three as the engine's progress); ``Reply`` to each ``CacheCall`` and, for the
loading commands (``Pin``, ``Prefetch``), ``LoadDone`` when the load finishes; ``Alive`` every
``alive_interval_s`` from a thread of its own, whatever the engine loop does (liveness: the
watchdog counts every message as a sign of life, and silence as a frozen process).

Errors cross the pipe as a ``PackedError`` (``engine/transport/packed_errors.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.sched.stats import QueueView
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.packed_errors import PackedError
from loraplex.engine.transport.worker import WorkerHandles
from loraplex.residency.cache import CacheSummary, ResidencyChanges
from loraplex.residency.ledger import Tier

# --- cache commands (run in the child, on its adapter cache) -----------------------------------


@dataclass(frozen=True)
class CacheCommand:
    """A cache-control call; ``loads`` commands answer at once and report their load later."""

    loads: ClassVar[bool] = False  # True: the result is a Future completing when the load does


@dataclass(frozen=True)
class Snapshot(CacheCommand):
    """The whole residency snapshot (admin view; not for /metrics)."""


@dataclass(frozen=True)
class Pin(CacheCommand):
    loads: ClassVar[bool] = True
    key: AdapterKey  # the revision to keep
    tier: Tier  # where to keep it


@dataclass(frozen=True)
class Prefetch(CacheCommand):
    loads: ClassVar[bool] = True
    key: AdapterKey  # the revision to load if worth its victims
    tier: Tier  # into this tier


@dataclass(frozen=True)
class Unpin(CacheCommand):
    key: AdapterKey  # the pinned revision
    tier: Tier  # the tier it was pinned in


@dataclass(frozen=True)
class Evict(CacheCommand):
    key: AdapterKey  # the revision whose copy goes
    tier: Tier  # from this tier


@dataclass(frozen=True)
class Holds(CacheCommand):
    key: AdapterKey  # the revision whose copy was kept
    tier: Tier  # in this tier


@dataclass(frozen=True)
class SetWarm(CacheCommand):
    key: AdapterKey  # the revision
    warm: WarmPolicy | None  # its new warm policy; None: the default


@dataclass(frozen=True)
class DropAutoWarm(CacheCommand):
    """A deprecated revision's automatic warm policy and request rates go (nothing standing:
    a restarted child starts without rates)."""

    key: AdapterKey  # the revision


@dataclass(frozen=True)
class UpdateTenants(CacheCommand):
    """Every tenant's settings, for the cache and the engine (not only the cache)."""

    settings: dict[str, TenantSettings]  # tenant name -> settings


@dataclass(frozen=True)
class HoldMerges(CacheCommand):
    """Holds (or releases) revisions against merging; a hold answers those merged now
    (``engine/merge_holds.py``). Runs on the engine's ``MergeHolds``, not on the cache."""

    refs: frozenset[str]  # ``tenant/name@revision`` of each
    hold: bool  # True: hold them; False: release one hold on each


@dataclass(frozen=True)
class Dedicate(CacheCommand):
    """The revision a fleet's topology asks this engine's ``auto`` mode to merge (None: decide
    alone again); runs on the engine's ``MergeHolds`` (docs/modes.md, "Topology")."""

    ref: str | None  # ``tenant/name@revision``; None: no dedication


# --- parent -> child -------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """What the child builds and serves: sent once, before anything else."""

    builder: Callable[..., WorkerHandles]  # a module-level function (pickled by reference)
    args: tuple[Any, ...]  # its arguments
    intervals: tuple[float, float, float]  # the child's (state publish, heartbeat, alive) s


@dataclass(frozen=True)
class AddRequest:
    request: EngineRequest  # a new generation request


@dataclass(frozen=True)
class AbortRequest:
    request_id: str  # the live request to abort (unknown ids: no-op)


@dataclass(frozen=True)
class PauseRequest:
    request_id: str  # a live request whose consumer stopped (or resumed) reading its output
    paused: bool  # True: stop generating for it; False: generate again (unknown ids: no-op)


@dataclass(frozen=True)
class CacheCall:
    call_id: int  # answered by the Reply (and LoadDone) carrying this id
    command: CacheCommand  # what to run


@dataclass(frozen=True)
class Stop:
    """Stop the engine (live requests end with an error), close the cache, exit."""


# --- child -> parent -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    max_loras: int  # the child's GPU adapter slots


@dataclass(frozen=True)
class StartFailed:
    error: PackedError  # why the builder failed


@dataclass(frozen=True)
class StepOut:
    items: list[tuple[str, TokenDelta | PackedError]]  # (request id, delta or error), in order


@dataclass(frozen=True)
class StatePublish:
    """What changed since the previous publish; None: unchanged."""

    queue: QueueView | None  # the scheduler's counts and queued adapters
    residency: ResidencyChanges | None  # ready tiers per changed adapter (or all, ``full``)
    summary: CacheSummary | None  # the cache's counters and per-tier totals


@dataclass(frozen=True)
class Heartbeat:
    """The engine loop turned (idle or not) and had nothing else to send."""


@dataclass(frozen=True)
class Alive:
    """The engine process runs (sent by its liveness thread, not by its engine loop)."""


@dataclass(frozen=True)
class Reply:
    call_id: int  # the CacheCall answered
    ok: bool  # False: ``value`` is a PackedError
    value: Any  # the command's result (a loading command's: whether its load is already done)


@dataclass(frozen=True)
class LoadDone:
    call_id: int  # the Pin / Prefetch whose load finished
    error: PackedError | None  # None: loaded
