"""``EngineReplica`` on a real small engine (thread mode, the demo model and adapters): its
stream framing, cache calls, routing report and board status; and, with fakes, that closing its
stream closes the engine's, and the eviction rate it reports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.demo.assets import DemoAssets
from loraplex.engine.protocol import EngineHealth, EngineLoad, EngineRequest, TokenDelta
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import Pin, Snapshot, Unpin, UpdateTenants
from loraplex.engine.transport.packed_errors import unpack_error
from loraplex.errors import EngineUnavailableError, LoraplexError
from loraplex.fleet.board import PINS_KEY
from loraplex.fleet.replica import EVICTION_WINDOW_S, EngineReplica, build_replica_parts
from loraplex.fleet.routing import UP_KEY
from loraplex.fleet.wire import Accepted, Failed
from loraplex.registry import open_registry
from loraplex.residency.cache.view import CacheSummary, ResidencySnapshot
from loraplex.residency.ledger import Tier
from loraplex.router.reports import decode_report
from loraplex.sampling import SamplingParams
from loraplex.serve.bootstrap import register_demo
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_settings import registry_config

REPLICA_ID = "replica-1"


@pytest.fixture(scope="module")
def replica(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineReplica]:
    data_dir = tmp_path_factory.mktemp("fleet-replica")
    model_dir = demo_assets.base_model_dir
    config = ServeConfig(data_dir=data_dir, model=model_dir, demo=False, max_loras=2)
    registry = open_registry(registry_config(config), base=BaseModelSpec.from_dir(model_dir))
    try:
        register_demo(registry, demo_assets)
    finally:
        registry.close()
    parts = build_replica_parts(config, model_dir, REPLICA_ID)
    built = EngineReplica(REPLICA_ID, parts)
    yield built
    built.close()
    assert not parts.replica_dir.exists()  # its disk cache goes with it


@pytest.fixture(scope="module")
def revision(demo_assets: DemoAssets) -> AdapterKey:
    # not a core adapter: the demo registers those warm (pinned in L1 whatever a test unpins)
    return demo_assets.adapter("acme", "billing", "r1").key(demo_assets.base_digest)


def _request(request_id: str, adapter: AdapterKey | None) -> EngineRequest:
    params = SamplingParams(max_tokens=3, temperature=0.0)
    return EngineRequest(request_id, "acme", adapter, (1, 5, 6, 7), params)


async def _items(replica: EngineReplica, request: EngineRequest) -> list[Any]:
    return [item async for item in replica.generate(request)]


def test_a_stream_starts_with_accepted_then_the_engines_deltas(replica: EngineReplica) -> None:
    first, *rest = asyncio.run(_items(replica, _request("base-1", None)))
    assert first == Accepted(REPLICA_ID)
    assert rest and all(isinstance(d, TokenDelta) for d in rest)
    assert rest[-1].finish_reason in ("stop", "length") and rest[-1].completion_tokens <= 3


def test_a_domain_error_ends_the_stream_as_failed(
    replica: EngineReplica, revision: AdapterKey
) -> None:
    unknown = replace(revision, revision="r404")
    first, last = asyncio.run(_items(replica, _request("missing-1", unknown)))
    assert first == Accepted(REPLICA_ID)
    assert isinstance(last, Failed)
    assert isinstance(unpack_error(last.error), LoraplexError)


def test_cache_calls_move_copies_that_the_report_and_status_show(
    replica: EngineReplica, revision: AdapterKey
) -> None:
    cache = replica._cache
    assert asyncio.run(replica.cache_call(Pin(revision, Tier.L1))) is None  # after its load
    report = replica.routing_report()
    assert report.replica_id == REPLICA_ID
    assert str(revision) in report.residency.l1 and str(revision) in report.residency.pinned
    assert str(revision) not in report.residency.l0
    asyncio.run(replica.cache_call(Pin(revision, Tier.L0)))
    assert str(revision) in replica.routing_report().residency.l0
    snapshot = asyncio.run(replica.cache_call(Snapshot()))
    assert isinstance(snapshot, ResidencySnapshot)
    assert {e.tier for e in snapshot.entries if e.key == revision} >= {Tier.L0, Tier.L1}

    status = replica.status()
    assert (status["replica_id"], status["healthy"]) == (REPLICA_ID, True)
    decoded = decode_report(status["report"])
    assert str(revision) in decoded.residency.l0 and decoded.replica_id == REPLICA_ID
    assert status["tiers"]["l0"]["count"] >= 1 and status["tiers"]["l1"]["count"] >= 1
    assert isinstance(status["load"], EngineLoad) and isinstance(status["summary"], CacheSummary)
    assert status["summary"].num_copies[Tier.L0] >= 1
    # the pins sent to it, and not the demo's warm policies (core adapters pinned in L1 too)
    assert decoded.residency.pinned - {str(revision)}  # copies its warm policies pinned
    assert status[PINS_KEY] == [(revision, Tier.L0), (revision, Tier.L1)]

    for tier in (Tier.L0, Tier.L1):
        asyncio.run(replica.cache_call(Unpin(revision, tier)))
    assert str(revision) not in replica.routing_report().residency.pinned
    assert replica.status()[PINS_KEY] == []
    cache.check_integrity()


def test_tenant_settings_reach_the_engines_tenant_book(replica: EngineReplica) -> None:
    settings = {"acme": TenantSettings(weight=4.0)}
    assert asyncio.run(replica.cache_call(UpdateTenants(settings))) is None
    assert replica._parts.runtime.tenants.weight("acme") == 4.0


def test_routing_stats_carry_the_encoded_report(replica: EngineReplica) -> None:
    stats = replica.routing_stats()
    assert set(stats) == {"report", "report_seq", "up"} and stats["up"] is True
    assert decode_report(stats["report"]).replica_id == REPLICA_ID
    # every report has a number of its own (readers decode a report once per number)
    numbers = [stats["report_seq"], replica.status()["report_seq"]]
    numbers.append(replica.routing_stats()["report_seq"])
    assert all(isinstance(n, int) for n in numbers) and numbers == sorted(set(numbers))
    assert replica.healthy()
    replica.check_health()


# --- with fakes -----------------------------------------------------------------------------


class FakeEngine:
    """An engine whose stream yields one delta per step and records when it was closed."""

    def __init__(self) -> None:
        self.closed = False

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        try:
            for i in range(100):
                yield TokenDelta((5,), "x", None, 4, i + 1)
        finally:
            self.closed = True


def _fake_replica(engine: Any = None, clock: Any = None) -> EngineReplica:
    parts: Any = SimpleNamespace(
        engine=engine or FakeEngine(), runtime=SimpleNamespace(cache=None), registry=None,
        replica_dir=Path("unused"),
    )  # fmt: skip
    return EngineReplica("fake", parts, clock=clock or (lambda: 0.0))


def test_closing_the_stream_closes_the_engines_stream_at_once() -> None:
    engine = FakeEngine()
    replica = _fake_replica(engine)

    async def read_then_leave() -> bool:
        stream = replica.generate(_request("leave-1", None))
        assert await anext(stream) == Accepted("fake")
        await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
        return engine.closed  # before the loop had a chance to finalize anything

    assert asyncio.run(read_then_leave())


def test_a_hung_engine_marks_its_replica_unhealthy_everywhere_the_fleet_looks() -> None:
    hung = EngineHealth(False, 0, "the engine is hung: no progress for 10.0 s", hung=True)
    replica = _fake_replica(SimpleNamespace(health=lambda: hung))
    assert not replica.healthy()  # the board's ``healthy`` (the ingress's rotation)
    with pytest.raises(EngineUnavailableError, match="hung"):
        replica.check_health()  # Ray Serve's health check: the replica is replaced


def test_a_hung_engines_status_and_routing_stats_say_hung_and_why(
    replica: EngineReplica, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board's entry (``fleet status``, ``/admin/fleet``) names the hang, not only
    ``healthy: false``; the router's stats say not up."""
    assert replica.status()["down_reason"] is None and not replica.status()["hung"]
    why = "the engine is hung: no progress for 10.0 s with work pending; retry shortly"
    hung = EngineHealth(False, 0, why, hung=True)
    monkeypatch.setattr(replica._engine, "health", lambda: hung)
    status = replica.status()
    assert (status["healthy"], status["hung"], status["down_reason"]) == (False, True, why)
    assert replica.routing_stats()[UP_KEY] is False


def test_evictions_per_min_counts_the_last_window() -> None:
    replica = _fake_replica()
    rate = replica._evictions_per_min
    assert rate(0.0, 0) == 0.0
    assert rate(10.0, 6) == 6.0  # a young replica: over a whole window, not its 10 s
    assert rate(EVICTION_WINDOW_S, 12) == 12.0
    # At 90 s the samples of 0 s and 10 s are older than a window: 14 - 12 since the one of
    # 60 s, over a whole window.
    assert rate(90.0, 14) == pytest.approx(2.0)
    assert rate(300.0, 14) == 0.0  # quiet for minutes
