"""The live page's history: ``TrafficTally`` (per class, top revisions, bounded), ``FleetHistory``
(a ring of samples with a manual clock), ``HistorySampler`` (fixed interval, no catch-up burst),
the memory bound, and ``GET /admin/fleet/history`` (admin key, real requests through the app)."""

from __future__ import annotations

import logging
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from conftest import ADMIN_KEY, Rig
from live import client, live_server

from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.router.fleet_state import FleetState, ReplicaLoadView, ReplicaState, TierOccupancy
from loraplex.server.history import (
    MEMORY_BOUND_BYTES,
    FleetHistory,
    HistoryConfig,
    HistorySampler,
    window_top_revisions,
)
from loraplex.server.traffic_tally import BASE_MODEL, OTHER, Traffic, TrafficTally


@dataclass
class CountingFleet:
    """``num_replicas`` replicas whose L0 hits grow by one per view; views one second apart."""

    num_replicas: int = 1
    num_views: int = 0
    fail_next: bool = False
    replica_ids: list[str] = field(default_factory=list)

    def fleet_state(self) -> FleetState:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the board did not answer")
        self.num_views += 1
        ids = self.replica_ids or [f"replica-{i:04d}" for i in range(self.num_replicas)]
        replicas = tuple(_replica(rid, self.num_views) for rid in ids)
        return FleetState(1.7e9 + self.num_views, "affinity", replicas, {"affinity_l0": 1})


def _replica(replica_id: str, n: int) -> ReplicaState:
    tiers = {t: TierOccupancy(3, 100 * n, 10_000) for t in ("l0", "l1", "l2")}
    hits = {"l0": n, "l1": 0, "l2": 0, "miss": 1}
    return ReplicaState(replica_id, True, 0.5, tiers, hits, ReplicaLoadView(1, 2, 30, 0.4, 0.0))


def test_config_refuses_what_it_cannot_keep() -> None:
    with pytest.raises(ValueError, match="interval_s 0 is invalid"):
        HistoryConfig(interval_s=0)
    with pytest.raises(ValueError, match=r"length_s 5\.0 is invalid; expected >= interval_s 10\.0"):
        HistoryConfig(length_s=5.0)
    with pytest.raises(ValueError, match="expected <= 100000 samples"):
        HistoryConfig(interval_s=0.01, length_s=3600)
    with pytest.raises(ValueError, match="top_revisions 0 is invalid"):
        HistoryConfig(top_revisions=0)
    with pytest.raises(ValueError, match="max_replicas -1 is invalid"):
        HistoryConfig(max_replicas=-1)
    assert HistoryConfig().max_samples == 360
    assert HistoryConfig(interval_s=7, length_s=60).max_samples == 9  # rounded up


def test_tally_counts_classes_and_ranks_revisions_by_tokens() -> None:
    tally = TrafficTally(max_tracked=100, top_n=2)
    for _ in range(3):
        tally.record("high", "acme/a@r1", 10, "stop")
    tally.record("normal", "acme/b@r1", 50, "length")
    tally.record("normal", "globex/c@r2", 5, "error")
    tally.record("batch", None, 7, "stop")
    interval = tally.drain()
    assert interval.classes == {
        "high": Traffic(3, 30, 0),
        "normal": Traffic(2, 55, 1),
        "batch": Traffic(1, 7, 0),
    }
    assert [(r.revision, r.traffic) for r in interval.top_revisions] == [
        ("acme/b@r1", Traffic(1, 50, 0)),
        ("acme/a@r1", Traffic(3, 30, 0)),
    ]
    assert interval.other_revisions == Traffic(2, 12, 1)  # globex/c@r2 and the base model
    assert interval.num_other_revisions == 2
    empty = tally.drain()  # drained: the next interval starts from zero
    assert empty.classes == {} and empty.top_revisions == () and empty.num_other_revisions == 0


def test_tally_names_at_most_max_tracked_revisions_per_interval() -> None:
    tally = TrafficTally(max_tracked=4, top_n=8)
    for i in range(1000):  # a tenant cycling through revision names
        tally.record("normal", f"t/a@r{i}", 1, "stop")
    interval = tally.drain()
    named = {r.revision for r in interval.top_revisions}
    assert named == {f"t/a@r{i}" for i in range(4)} and OTHER not in named
    assert interval.other_revisions == Traffic(996, 996, 0)  # everyone else, still counted
    assert interval.num_other_revisions == 1  # one OTHER entry
    tally.record("normal", None, 2, "stop")
    assert tally.drain().top_revisions[0].revision == BASE_MODEL


def test_history_samples_intervals_into_a_bounded_ring() -> None:
    clock, fleet = ManualClock(100.0), CountingFleet()
    tally = TrafficTally()
    history = FleetHistory(fleet, tally, HistoryConfig(interval_s=10, length_s=30), clock)
    for i in range(5):
        clock.advance(10 if i else 4)
        tally.record("high", "acme/a@r1", i + 1, "stop")
        history.sample()
    kept = history.samples()
    assert [s.seq for s in kept] == [3, 4, 5]  # three samples of ten seconds: the oldest dropped
    assert [s.interval_s for s in kept] == [10.0, 10.0, 10.0]
    assert [s.traffic.classes["high"].tokens for s in kept] == [3, 4, 5]
    assert [s.fleet.at_s for s in kept] == [1.7e9 + 3, 1.7e9 + 4, 1.7e9 + 5]
    assert [s.seq for s in history.samples(after_seq=4)] == [5]
    body = history.to_json(after_seq=3)
    assert [s["seq"] for s in body["samples"]] == [4, 5]
    assert body["max_samples"] == 3 and body["window"]["num_samples"] == 3
    assert body["last_seq"] == 5
    assert body["window"]["seconds"] == 30.0
    assert body["window"]["top_revisions"] == [
        {"revision": "acme/a@r1", "requests": 3, "tokens": 12, "errors": 0}
    ]
    assert body["samples"][0]["fleet"]["replicas"][0]["hits"]["l0"] == 4


def test_a_sample_keeps_at_most_max_replicas_by_id() -> None:
    fleet = CountingFleet(replica_ids=["c", "a", "d", "b"])
    history = FleetHistory(fleet, TrafficTally(), HistoryConfig(max_replicas=2), ManualClock())
    sample = history.sample()
    assert [r.replica_id for r in sample.fleet.replicas] == ["a", "b"]
    assert sample.num_replicas_left_out == 2
    assert sample.to_json()["num_replicas_left_out"] == 2


def test_window_top_revisions_sums_samples_and_folds_the_rest_into_other() -> None:
    clock, tally = ManualClock(), TrafficTally(top_n=2)
    history = FleetHistory(CountingFleet(), tally, HistoryConfig(top_revisions=2), clock)
    for tokens in ({"x": 5, "y": 4, "z": 1}, {"z": 9, "x": 1, "w": 3}):
        for name, n in tokens.items():
            tally.record("normal", f"t/{name}@r1", n, "stop")
        history.sample()
    top, other, num_other = window_top_revisions(history.samples(), 2)
    # Interval tops: (x 5, y 4; other z 1) and (z 9, w 3; other x 1).
    assert [(r.revision, r.traffic.tokens) for r in top] == [("t/z@r1", 9), ("t/x@r1", 5)]
    assert other == Traffic(4, 9, 0)  # y 4 and w 3 named, z 1 and x 1 inside the intervals' other
    assert num_other == 2


def test_sampler_samples_on_a_fixed_interval_without_catch_up_bursts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, fleet = ManualClock(), CountingFleet()
    history = FleetHistory(fleet, TrafficTally(), HistoryConfig(interval_s=10), clock)
    sampler = HistorySampler(history, clock)
    taken = []
    for _ in range(35):  # 35 s in steps of one second
        clock.advance(1)
        taken.append(sampler.tick())
    assert [i + 1 for i, t in enumerate(taken) if t] == [10, 20, 30]
    clock.advance(100)  # a stalled process: one sample, then back on the interval
    assert sampler.tick() is True and sampler.tick() is False
    clock.advance(10)
    fleet.fail_next = True
    with caplog.at_level(logging.WARNING, logger="loraplex.server.history"):
        assert sampler.tick() is False
    assert "a sample failed" in caplog.text
    clock.advance(10)
    assert sampler.tick() is True
    assert len(history.samples()) == 5


def test_sampler_thread_starts_and_stops() -> None:
    clock = ManualClock()
    history = FleetHistory(CountingFleet(), TrafficTally(), HistoryConfig(interval_s=1), clock)
    sampler = HistorySampler(history, clock, poll_s=0.01)
    sampler.start()
    clock.advance(1)
    for _ in range(500):
        if history.samples():
            break
        time.sleep(0.01)
    sampler.close()
    assert len(history.samples()) == 1


def test_memory_stays_under_the_stated_bound_at_the_defaults() -> None:
    """A full hour at the defaults, every sample as large as it can be: 40 replicas (16 kept),
    more distinct revisions per interval than are tracked, names of the longest length."""
    config = HistoryConfig()
    clock, tally = ManualClock(), TrafficTally(config.max_tracked_revisions, config.top_revisions)
    fleet = CountingFleet(num_replicas=40)
    name = "t" * 128 + "/" + "a" * 128 + "@{:0>128}"
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        history = FleetHistory(fleet, tally, config, clock)
        for i in range(config.max_samples + 20):
            for j in range(40):
                cls = ("high", "normal", "batch")[j % 3]
                tally.record(cls, name.format(i * 100 + j), j, "stop")
            clock.advance(config.interval_s)
            history.sample()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert len(history.samples()) == config.max_samples
    assert used < MEMORY_BOUND_BYTES, used


def test_history_route_needs_the_admin_key(rig: Rig) -> None:
    assert rig.client.get("/admin/fleet/history").status_code == 401
    assert rig.client.get("/admin/fleet/history", headers=rig.headers("acme")).status_code == 401
    answer = rig.client.get("/admin/fleet/history", headers=rig.admin)
    assert answer.status_code == 200 and answer.headers["cache-control"] == "no-store"
    assert answer.json()["samples"] == [] and answer.json()["max_samples"] == 360
    bad = rig.client.get("/admin/fleet/history?after=-1", headers=rig.admin)
    assert bad.status_code == 400 and "after" in bad.text, bad.text


def test_history_route_returns_the_traffic_served_before_it_was_asked(rig: Rig) -> None:
    history: FleetHistory = rig.client.app.state.history  # type: ignore[attr-defined]
    for model, n in (("support", 3), ("acme/billing@r1", 1)):
        for _ in range(n):
            answer = rig.client.post(
                "/v1/completions",
                json={"model": model, "prompt": "hi", "max_tokens": 8},
                headers=rig.headers("acme"),
            )
            assert answer.status_code == 200, answer.text
    first = history.sample()
    rig.client.post(
        "/v1/completions",
        json={"model": "loraplex-demo-small", "prompt": "x", "max_tokens": 4},
        headers=rig.headers("globex"),
    )
    history.sample()
    body = rig.client.get("/admin/fleet/history", headers=rig.admin).json()
    one, two = body["samples"]
    assert one["classes"] == {"normal": {"requests": 4, "tokens": 8, "errors": 0}}
    assert [(r["revision"], r["requests"]) for r in one["top_revisions"]] == [
        ("acme/support@r1", 3),
        ("acme/billing@r1", 1),
    ]
    assert one["fleet"]["replicas"][0]["replica_id"] == "local"
    assert [r["revision"] for r in two["top_revisions"]] == [BASE_MODEL]
    window = body["window"]
    assert window["top_revisions"][0] == {
        "revision": "acme/support@r1", "requests": 3, "tokens": 6, "errors": 0,
    }  # fmt: skip
    later = rig.client.get(f"/admin/fleet/history?after={first.seq}", headers=rig.admin).json()
    assert [s["seq"] for s in later["samples"]] == [first.seq + 1]


def test_a_built_server_samples_its_own_traffic_and_stops_its_sampler(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    with live_server(demo_assets, tmp_path, admin_key=ADMIN_KEY, engine_process=False) as live:
        sampler = live.server.history
        assert sampler is not None and sampler.running
        tenant = next(iter(live.server.sample_keys))
        models = client(live.url, live.key(tenant)).models.list().data
        adapter = next(m.id for m in models if m.id != live.server.deps.config.base_model_name)
        done = client(live.url, live.key(tenant)).completions.create(
            model=adapter, prompt="hello", max_tokens=4
        )
        revision = done.model_extra["loraplex"]["revision"]  # type: ignore[index]
        live.server.app.state.history.sample()  # the thread would take it within 10 s
        with httpx.Client(base_url=live.url, timeout=30) as http:
            body = http.get(
                "/admin/fleet/history", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
            )
        (sample,) = body.json()["samples"]
        assert sample["classes"]["normal"] == {
            "requests": 1, "tokens": done.usage.completion_tokens, "errors": 0,  # type: ignore[union-attr]
        }  # fmt: skip
        assert [r["revision"] for r in sample["top_revisions"]] == [revision]
        assert sample["fleet"]["replicas"][0]["hits"]["miss"] >= 1
    assert not sampler.running  # Server.close() stopped it
