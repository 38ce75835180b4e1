"""ServeReleaseEnv over a real cache (moving nothing) and the fake engine; the ReleaseLoop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from fakes import FakeEngine, null_cache, reply_for

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.release.traffic import (
    CANDIDATE,
    ReleaseTraffic,
    TrackedRevision,
    Verdict,
)
from loraplex.residency.cache import TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.serve.release_env import PROBE_PREFIX, ReleaseLoop, ServeReleaseEnv, all_of
from loraplex.server.pin_owners import OwnedPins

WAIT_S = 30.0


@pytest.fixture
def cache() -> Iterator[TieredAdapterCache]:
    built = null_cache(slots=2)
    yield built
    built.close()


@pytest.fixture
def key(demo_assets: DemoAssets) -> AdapterKey:
    return demo_assets.adapter("acme", "support", "r2").key(demo_assets.base_digest)


def _env(cache: TieredAdapterCache, engine: FakeEngine, traffic: ReleaseTraffic) -> ServeReleaseEnv:
    return ServeReleaseEnv(OwnedPins(cache), engine, traffic)


def _pinned(cache: TieredAdapterCache, key: AdapterKey) -> set[Tier]:
    return {e.tier for e in cache.snapshot().entries if e.key == key and e.pinned}


def test_probe_is_a_greedy_request_as_the_owner(cache: TieredAdapterCache, key: AdapterKey) -> None:
    engine = FakeEngine()
    env = _env(cache, engine, ReleaseTraffic(ManualClock(), tuple))
    try:
        text = env.probe(key, "acme", "The answer is", 2).result(WAIT_S)
        (request,) = engine.requests
        assert text == " ".join(reply_for(request).split(" ")[:3])  # two words, cut there
        assert request.request_id.startswith(f"{PROBE_PREFIX}-")
        assert (request.tenant, request.adapter_key) == ("acme", key)
        assert (request.params.temperature, request.params.max_tokens) == (0.0, 2)
        assert request.prompt_token_ids == tuple(engine.tokenizer.encode("The answer is"))
        assert request.probe  # not traffic: ``auto`` does not merge on it (attack27)
    finally:
        env.close()


def test_probe_failure_reaches_the_future(cache: TieredAdapterCache, key: AdapterKey) -> None:
    engine = FakeEngine(errors={key.ref: RuntimeError("load failed")})
    env = _env(cache, engine, ReleaseTraffic(ManualClock(), tuple))
    try:
        with pytest.raises(RuntimeError, match="load failed"):
            env.probe(key, "acme", "x", 4).result(WAIT_S)
    finally:
        env.close()


def test_prewarm_hold_unhold_move_the_pins(cache: TieredAdapterCache, key: AdapterKey) -> None:
    env = _env(cache, FakeEngine(), ReleaseTraffic(ManualClock(), tuple))
    try:
        env.prewarm(key, gpu=False).result(WAIT_S)
        assert _pinned(cache, key) == {Tier.L1}
        env.prewarm(key, gpu=True).result(WAIT_S)
        assert _pinned(cache, key) == {Tier.L0, Tier.L1}
        assert cache.is_resident(key, Tier.L0)
        env.unhold(key)
        assert _pinned(cache, key) == set()
        assert cache.is_resident(key, Tier.L1)  # left to normal eviction, not dropped
        env.hold(key)
        assert _pinned(cache, key) == {Tier.L1}
        cache.check_integrity()
    finally:
        env.close()


def test_window_reads_the_traffic_by_revision_ref(cache: TieredAdapterCache) -> None:
    clock = ManualClock()
    traffic = ReleaseTraffic(clock, tuple)
    traffic.set_tracked([TrackedRevision("acme/support@r2", "rel", CANDIDATE, "canary")])
    traffic.record("acme/support@r2", Verdict.ERROR, None, None)
    env = _env(cache, FakeEngine(), traffic)
    try:
        assert env.window("rel", "acme/support@r2", 0.0).errors == 1
        assert env.window("rel", "acme/support", 0.0).requests == 0  # the alias is no key
    finally:
        env.close()


def test_all_of_fails_with_the_first_failure() -> None:
    first: Future[None] = Future()
    second: Future[None] = Future()
    combined = all_of([first, second])
    first.set_result(None)
    assert not combined.done()
    second.set_exception(ValueError("no room"))
    with pytest.raises(ValueError, match="no room"):
        combined.result(0)
    assert all_of([]).done()


def test_loop_survives_failing_ticks_and_refreshes() -> None:
    calls: list[str] = []

    def tick() -> None:
        calls.append("tick")
        raise RuntimeError("database locked")

    def source() -> list[TrackedRevision]:
        calls.append("refresh")
        return []

    loop = ReleaseLoop(tick, ReleaseTraffic(ManualClock(), source, refresh_s=0.0))
    loop.run_once()
    loop.run_once()
    assert calls == ["tick", "refresh", "tick", "refresh"]
    assert (loop.num_ticks, loop.num_failures) == (2, 2)


def test_loop_thread_ticks_until_stopped() -> None:
    ticked = threading.Event()
    loop = ReleaseLoop(ticked.set, ReleaseTraffic(ManualClock(), tuple), interval_s=0.01)
    loop.start()
    try:
        assert ticked.wait(WAIT_S)
    finally:
        loop.stop()
    count = loop.num_ticks
    assert count >= 1
    assert loop.num_ticks == count  # no tick after stop returned
    with pytest.raises(ValueError, match="interval_s"):
        ReleaseLoop(ticked.set, ReleaseTraffic(ManualClock(), tuple), interval_s=0)
