"""The release controller inside ``loraplex serve``: ``ServeReleaseEnv`` (the controller's
``ReleaseEnv`` over this server's adapter cache, engine and live traffic), ``ReleaseLoop``, the
daemon thread that ticks the controller, and ``start_releases`` wiring both for a server.

Probes run on a private event loop on its own thread: the engine clients deliver output to
whichever loop asked (one mailbox per loop), so the controller never touches the HTTP server's
loop and a slow probe never delays a tenant's request handling.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineClient, EngineRequest
from loraplex.registry import Registry
from loraplex.release.controller import ReleaseController, WallClock
from loraplex.release.model import ReleaseState, RevisionWindow
from loraplex.release.store import ReleaseStore
from loraplex.release.traffic import ReleaseTraffic, tracked_revisions
from loraplex.residency.ledger import Tier
from loraplex.sampling import SamplingParams
from loraplex.server.merge_guard import merged_revisions
from loraplex.server.pin_owners import RELEASE, OwnedPins

_log = logging.getLogger(__name__)
TICK_INTERVAL_S = 0.25  # how often the controller looks at its releases
PROBE_PREFIX = "probe"  # engine request ids of probes: probe-<hex>
HOLD_TIER = Tier.L1  # a release holds its baseline pinned here


def prewarm_tiers(gpu: bool) -> tuple[Tier, ...]:
    """The tiers a release's candidate is pinned in (L1; and L0 with the plan's ``gpu``)."""
    return (Tier.L1, Tier.L0) if gpu else (Tier.L1,)


def all_of(futures: list[Future[None]]) -> Future[None]:
    """Done when every one of ``futures`` is; fails with the first failure seen."""
    combined: Future[None] = Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def on_done(done: Future[None]) -> None:
        error = done.exception()
        with lock:
            remaining[0] -= 1
            finished = remaining[0] == 0
            if combined.done():
                return
            if error is not None:
                combined.set_exception(error)
            elif finished:
                combined.set_result(None)

    if not futures:
        combined.set_result(None)
    for future in futures:
        future.add_done_callback(on_done)
    return combined


class ServeReleaseEnv:
    """``ReleaseEnv`` for one serving process (see ``release/env.py``)."""

    def __init__(self, cache: OwnedPins, engine: EngineClient, traffic: ReleaseTraffic) -> None:
        self._cache = cache
        self._engine = engine
        self._traffic = traffic
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="loraplex-release-probes", daemon=True
        )
        self._thread.start()

    def prewarm(self, key: AdapterKey, *, gpu: bool) -> Future[None]:
        return all_of([self._cache.pin(key, tier, RELEASE) for tier in prewarm_tiers(gpu)])

    def hold(self, key: AdapterKey) -> None:
        loaded = self._cache.pin(key, HOLD_TIER, RELEASE)
        loaded.add_done_callback(lambda done: _log_failure(done, f"holding {key.ref} in L1"))

    def unhold(self, key: AdapterKey) -> None:
        # NOTE: pins have owners (``server/pin_owners.py``): an operator's pin of the same
        # revision stays.
        self._cache.unpin(key, Tier.L0, RELEASE)
        self._cache.unpin(key, Tier.L1, RELEASE)

    def is_merged(self, key: AdapterKey) -> bool:
        return key.ref in merged_revisions(self._engine)

    def probe(self, key: AdapterKey, tenant: str, prompt: str, max_tokens: int) -> Future[str]:
        request = EngineRequest(
            request_id=f"{PROBE_PREFIX}-{secrets.token_hex(12)}",
            tenant=tenant,
            adapter_key=key,
            prompt_token_ids=tuple(self._engine.tokenizer.encode(prompt)),
            params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            probe=True,  # not traffic: ``auto`` does not count it (EngineRequest.probe)
        )
        return asyncio.run_coroutine_threadsafe(self._complete(request), self._loop)

    def window(self, release_id: str, revision_ref: str, since: float) -> RevisionWindow:
        return self._traffic.window(revision_ref, since)

    def close(self) -> None:
        """Stops the probe loop (probes still running fail with CancelledError)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _complete(self, request: EngineRequest) -> str:
        parts = [delta.text async for delta in self._engine.generate(request)]
        return "".join(parts)


def _log_failure(done: Future[None], what: str) -> None:
    error = done.exception()
    if error is not None:
        _log.warning("release: %s failed: %s", what, error)


class ReleaseLoop:
    """Calls ``tick`` (the controller's) every ``interval_s`` on a daemon thread, refreshing the
    tracked revisions of ``traffic`` first; a failing tick is logged and the loop goes on."""

    def __init__(
        self,
        tick: Callable[[], object],
        traffic: ReleaseTraffic,
        interval_s: float = TICK_INTERVAL_S,
        *,
        engine_up: Callable[[], bool] = lambda: True,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s {interval_s} is invalid; expected > 0")
        # NOTE: no tick while the engine is down (starting, restarting): its prewarms and
        # probes would fail for reasons that are not the candidate's, and abort the release.
        self._engine_up = engine_up
        self._tick = tick
        self._traffic = traffic
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loraplex-release", daemon=True)
        self.num_ticks = 0  # ticks run (failed ones included)
        self.num_failures = 0  # ticks or refreshes that raised

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self._interval_s)

    def run_once(self) -> None:
        """One tick and refresh (the thread's body; tests call it directly)."""
        if not self._engine_up():
            return
        self._guarded(self._tick, "release controller tick")
        self._guarded(self._traffic.refresh, "release traffic refresh")
        self.num_ticks += 1

    def _guarded(self, step: Callable[[], object], what: str) -> None:
        try:
            step()
        except Exception:  # a bad tick must never take the server down
            self.num_failures += 1
            _log.exception("%s failed", what)


@dataclass
class ReleaseService:
    """What ``start_releases`` started; ``close`` stops it (before the engine shuts down)."""

    env: ServeReleaseEnv  # the controller's environment (owns the probe loop)
    loop: ReleaseLoop  # the ticking thread
    controller: ReleaseController  # the controller itself

    def close(self) -> None:
        self.loop.stop()
        self.env.close()


def start_releases(
    registry: Registry,
    engine: EngineClient,
    cache: OwnedPins,
    traffic: ReleaseTraffic,
    *,
    env: Callable[[OwnedPins, ReleaseTraffic], ServeReleaseEnv] | None = None,
) -> ReleaseService:
    """The release controller of one server, ticking on its own thread. ``traffic`` must run
    on the controller's clock (``WallClock``) and be the server's (``ServerDeps.releases``).
    ``env``: builds the controller's environment (a fleet's probes every replica); default
    ``ServeReleaseEnv`` over ``engine``."""
    release_env = ServeReleaseEnv(cache, engine, traffic) if env is None else env(cache, traffic)

    def on_move(to: ReleaseState, release_id: str) -> None:
        traffic.count_transition(to.value, release_id)  # loraplex_release_transitions_total

    controller = ReleaseController(registry, release_env, traffic.clock, on_move=on_move)
    loop = ReleaseLoop(controller.tick, traffic, engine_up=lambda: engine.health().up)
    loop.start()
    return ReleaseService(release_env, loop, controller)


def release_traffic(registry: Registry) -> ReleaseTraffic:
    """The server's release traffic: tracks what the registry's releases in flight name, on the
    controller's wall clock."""
    store = ReleaseStore(registry)
    return ReleaseTraffic(WallClock(), lambda: tracked_revisions(store.list_releases()))
