"""``EngineReplica``: one engine with its own slot pool, CPU tier and disk cache, as the fleet
runs it in each engine replica (``fleet/deployments.py`` wraps it for Ray Serve; tests drive it
directly).

It streams ``generate`` with the ``wire`` framing, runs cache calls on its own cache, and
describes itself two ways: ``routing_report()`` (the router's ``ReplicaReport``, compact,
through Ray Serve's ``record_routing_stats``) and ``status()`` (the report plus the cache's
occupancy and hit counters, for the fleet board: ``fleet status``, ``/admin/fleet``, /metrics).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import aclosing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.engine.factory import AdapterRuntime
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.transport.cache_commands import run_cache_command, run_hold_command
from loraplex.engine.transport.messages import (
    CacheCommand,
    Dedicate,
    HoldMerges,
    UpdateTenants,
)
from loraplex.engine.transport.packed_errors import pack_error
from loraplex.engine.transport.thread_client import AsyncEngine
from loraplex.errors import EngineUnavailableError
from loraplex.fleet.board import PINS_KEY
from loraplex.fleet.report_cache import SEQ_KEY, report_numbers
from loraplex.fleet.routing import REPORT_KEY, UP_KEY
from loraplex.fleet.standing import pin_order
from loraplex.fleet.wire import Accepted, Failed
from loraplex.registry import Registry, open_registry
from loraplex.residency.ledger import Tier
from loraplex.router.fleet_state import hits_of, tiers_of
from loraplex.router.reports import ReplicaLoad, ReplicaReport, Residency, encode_report
from loraplex.serve.config import ServeConfig
from loraplex.serve.logs import stderr_file

EVICTION_WINDOW_S = 60.0  # ``evictions_per_min`` counts evictions over this window


@dataclass(frozen=True)
class ReplicaParts:
    """What a replica runs: its engine and runtime, the registry connection, its own dir."""

    engine: AsyncEngine
    runtime: AdapterRuntime
    registry: Registry
    replica_dir: Path  # this replica's disk cache (removed when it closes)


class EngineReplica:
    """One engine replica (see the module docstring)."""

    def __init__(
        self, replica_id: str, parts: ReplicaParts, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.replica_id = replica_id
        self._parts = parts
        self._engine = parts.engine
        self._cache = parts.runtime.cache
        self._clock = clock
        self._evictions: deque[tuple[float, int]] = deque()  # (time, cumulative evictions)
        # NOTE: Ray's routing-stats call and the board push build reports on two threads.
        self._evictions_lock = threading.Lock()
        self._report_numbers = report_numbers()  # each report's number (``report_cache``)
        self._log = stderr_file()  # where this process's ``loraplex`` lines go (Ray's worker log)

    async def generate(
        self, request: EngineRequest
    ) -> AsyncIterator[Accepted | TokenDelta | Failed]:
        """``Accepted``, then the engine's deltas; a domain error ends the stream as ``Failed``.
        Closing the stream (the ingress cancelled it) aborts the request in the engine."""
        yield Accepted(self.replica_id)
        try:
            # NOTE: closed explicitly: left to the garbage collector, the engine would go on
            # generating for a request nobody reads.
            async with aclosing(self._engine.generate(request)) as deltas:
                async for delta in deltas:
                    yield self._signed(delta)
        except Exception as exc:  # queue full, adapter failed to load, ...: the caller's error
            yield Failed(pack_error(exc))

    def _signed(self, delta: TokenDelta) -> TokenDelta:
        """``delta``, its engine trace (a traced request's last delta) naming this replica."""
        if delta.trace is None:
            return delta
        return replace(delta, trace=replace(delta.trace, replica_id=self.replica_id))

    async def cache_call(self, command: CacheCommand) -> Any:
        """``command`` on this replica's cache; a loading command returns once its load did
        (raising its error). ``UpdateTenants`` reaches the engine's tenant book too, ``HoldMerges``
        and ``Dedicate`` its merge holds (docs/modes.md)."""
        if isinstance(command, UpdateTenants):
            await asyncio.to_thread(self._parts.runtime.update_tenant_settings, command.settings)
            return None
        if isinstance(command, HoldMerges | Dedicate):  # may wait for a running merge
            return await asyncio.to_thread(
                run_hold_command, self._parts.runtime.merge_holds, command
            )
        # NOTE: on a worker thread: the cache's lock must never stall this replica's event
        # loop, which carries every stream it serves.
        value = await asyncio.to_thread(run_cache_command, self._cache, command)
        if command.loads:
            future: Future[None] = value
            await asyncio.wrap_future(future)
            return None
        return value

    def healthy(self) -> bool:
        return self._engine.health().up

    def check_health(self) -> None:
        """Raises while the engine cannot take requests (Ray Serve then replaces the replica)."""
        health = self._engine.health()
        if not health.up:
            raise EngineUnavailableError(health.down_reason or "the engine is down")

    def routing_report(self) -> ReplicaReport:
        """Residency and load now; ``at_s`` is this replica's clock (the router restamps it)."""
        cache = self._cache
        snapshot = cache.snapshot()
        loading = {str(e.key) for e in snapshot.entries if e.tier is Tier.L0 and not e.ready}
        pinned = {str(e.key) for e in snapshot.entries if e.pinned}
        tiers = {
            tier: {str(e.key) for e in snapshot.entries if e.tier is tier and e.ready}
            for tier in (Tier.L0, Tier.L1, Tier.L2)
        }
        load = self._engine.load_snapshot()
        merged_ref = None if load.mode is None else load.mode.merged_revision
        merged = {str(e.key) for e in snapshot.entries if e.key.ref == merged_ref}
        residency = Residency(
            l0=frozenset(tiers[Tier.L0]),
            l1=frozenset(tiers[Tier.L1]),
            l2=frozenset(tiers[Tier.L2]),
            loading=frozenset(loading),
            pinned=frozenset(pinned),
            merged=frozenset(merged),
        )
        now_s = self._clock()
        evictions = sum(snapshot.stats.evictions.values())
        replica_load = ReplicaLoad(
            num_queued=load.num_waiting,
            num_adapter_wait=load.num_adapter_wait,
            num_running=load.num_running,
            num_active_tokens=load.num_active_tokens,
            kv_usage=min(1.0, max(0.0, load.kv_usage)),
            evictions_per_min=self._evictions_per_min(now_s, evictions),
        )
        return ReplicaReport(self.replica_id, now_s, residency, replica_load)

    def routing_stats(self) -> dict[str, Any]:
        """What ``record_routing_stats`` hands Ray Serve: the encoded report, and whether the
        engine takes requests (a hung one leaves the router's rotation: ``routing.in_rotation``)."""
        return {
            REPORT_KEY: encode_report(self.routing_report()),
            SEQ_KEY: next(self._report_numbers),
            UP_KEY: self.healthy(),
        }

    def status(self) -> dict[str, Any]:
        """The fleet board's entry: the encoded report, occupancy, hit counters, health (and
        why it is down: the engine's own reason, "the engine is hung: ..." while hung)."""
        summary = self._cache.summary()
        health = self._engine.health()
        return {
            "replica_id": self.replica_id,
            "pid": os.getpid(),  # this replica's process (an operator's handle on a frozen one)
            "log": self._log,  # its log file on its node: ``fleet status`` prints it
            "healthy": health.up,
            "hung": health.hung,  # up is False then too; down_reason says for how long
            "down_reason": health.down_reason,
            "report": encode_report(self.routing_report()),
            SEQ_KEY: next(self._report_numbers),  # the report's number (``report_cache``)
            "tiers": {name: t.to_json() for name, t in tiers_of(summary).items()},
            "hits": hits_of(summary),
            "load": self._engine.load_snapshot(),  # EngineLoad: the ingress sums them
            "summary": summary,  # CacheSummary (pickled by Ray): the ingress sums them
            PINS_KEY: sorted(self._cache.explicit_pins(), key=pin_order),
        }

    def close(self) -> None:
        """Stops the engine, closes the cache and registry, removes this replica's disk cache."""
        parts = self._parts
        parts.engine.shutdown()
        parts.runtime.cache.close()
        parts.registry.close()
        shutil.rmtree(parts.replica_dir, ignore_errors=True)

    def _evictions_per_min(self, now_s: float, total: int) -> float:
        window = self._evictions
        with self._evictions_lock:
            window.append((now_s, total))
            while len(window) > 1 and now_s - window[0][0] > EVICTION_WINDOW_S:
                window.popleft()
            oldest_s, oldest = window[0]
        # NOTE: over at least a whole window, so a young replica's first evictions do not read
        # as a high rate.
        return max(0, total - oldest) * 60.0 / max(now_s - oldest_s, EVICTION_WINDOW_S)


def build_replica_parts(config: ServeConfig, model_dir: Path, replica_id: str) -> ReplicaParts:
    """The engine side of one replica (as ``serve``'s engine side builds it), with its disk cache
    in ``<data_dir>/replicas/<replica_id>``; the replica's process keeps the memory the engine's
    steps free, as an engine process does (``engine.heap``)."""
    import torch

    from loraplex.engine import heap
    from loraplex.engine.factory import build_engine
    from loraplex.serve.engine_settings import engine_config, registry_config, watchdog_policy
    from loraplex.serve.engine_side import apply_warm_policies, build_runtime

    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    heap.keep_freed_heap()
    base = BaseModelSpec.from_dir(model_dir)
    registry = open_registry(registry_config(config), base=base)
    replica_dir = config.data_dir / "replicas" / replica_id
    try:
        runtime = build_runtime(replace(config, data_dir=replica_dir), base, registry)
    except BaseException:
        registry.close()
        raise
    try:
        apply_warm_policies(registry, runtime, base.digest)
        engine = build_engine(
            model_dir, engine_config(config), runtime, watchdog=watchdog_policy(config)
        )
    except BaseException:
        runtime.cache.close()
        registry.close()
        raise
    return ReplicaParts(engine, runtime, registry, replica_dir)
