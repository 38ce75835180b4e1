"""The simulator drives loraplex's own decision code on a virtual clock (issue 30): it is
deterministic, never reads wall time, and its figures move as the real policies do."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from sim_inputs import cost, scenario

from loraplex.residency.cache import TieredAdapterCache
from loraplex.router import Reason, Router
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_the_same_inputs_give_the_same_result() -> None:
    trace = scenario("zipf-longtail", duration_s=10)
    config = SimConfig(replicas=3, max_loras=4)
    first = simulate(trace, config, cost()).to_json()
    assert simulate(trace, config, cost()).to_json() == first
    assert simulate(trace, replace(config, seed=1), cost()).metrics["requests"] == len(trace)


def test_the_virtual_clock_never_reads_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = scenario("hot-burst", duration_s=10)

    def wall(*_: object) -> float:
        raise AssertionError("the simulation read wall time")

    for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, name, wall)
    result = simulate(trace, SimConfig(replicas=2, max_loras=4), cost())
    assert result.metrics["completed"] == len(trace)


def test_switching_the_eviction_policy_changes_hits_as_the_real_policies_do() -> None:
    """hot-burst: cost_aware keeps the priority tenant's hot set through the batch sweep
    better than lru (fewer reloads after eviction, more of the hot tenant's leases from L0)."""
    trace = scenario("hot-burst", duration_s=40)
    runs = {
        policy: simulate(
            trace,
            # The whole pool to each tenant: the policies alone decide who keeps a slot.
            SimConfig(
                max_loras=10,
                eviction_policy=policy,
                cpu_adapter_bytes=8 << 20,
                default_tenant_tier_share=1.0,
            ),
            cost(),
        ).metrics
        for policy in ("lru", "cost_aware")
    }
    lru, aware = runs["lru"], runs["cost_aware"]
    assert (
        aware["by_tenant"]["prio"]["tier_at_lease"]["L0"]
        > (lru["by_tenant"]["prio"]["tier_at_lease"]["L0"])
    )
    assert sum(aware["reloads_after_eviction"].values()) < sum(
        lru["reloads_after_eviction"].values()
    )


def test_the_real_cache_and_router_are_the_ones_called(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"acquire": 0, "choose": 0}
    acquire, choose = TieredAdapterCache.acquire_future, Router.choose

    def counted_acquire(self: TieredAdapterCache, *a: object, **k: object) -> object:
        calls["acquire"] += 1
        return acquire(self, *a, **k)  # type: ignore[arg-type]

    def counted_choose(self: Router, *a: object, **k: object) -> object:
        calls["choose"] += 1
        return choose(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(TieredAdapterCache, "acquire_future", counted_acquire)
    monkeypatch.setattr(Router, "choose", counted_choose)
    trace = scenario("zipf-longtail", duration_s=5)
    metrics = simulate(trace, SimConfig(replicas=2), cost()).metrics
    assert calls["choose"] == len(trace)  # one routing decision per request
    assert calls["acquire"] == metrics["acquires"] >= len(trace)  # every lease asked of a cache


def test_a_small_fleet_routes_by_the_routers_reasons() -> None:
    trace = scenario("zipf-longtail", duration_s=20)
    results = {
        policy: simulate(trace, SimConfig(replicas=3, routing_policy=policy), cost()).metrics
        for policy in ("pow2", "affinity_until_saturated")
    }
    pow2, affinity = results["pow2"], results["affinity_until_saturated"]
    assert pow2["decisions"] == {Reason.POW2.value: len(trace)}
    assert set(affinity["decisions"]) <= {r.value for r in Reason}
    assert sum(affinity["decisions"].values()) == len(trace)
    assert affinity["decisions"][Reason.GPU_HIT.value] > 0
    assert affinity["decisions"][Reason.PLACEMENT.value] > 0
    assert sum(affinity["requests_per_replica"]) == len(trace)
    assert affinity["l0_hit_ratio"] > pow2["l0_hit_ratio"]  # affinity keeps adapters hot


def test_a_single_server_has_no_router_figures() -> None:
    metrics = simulate(scenario("uniform", duration_s=5), SimConfig(), cost()).metrics
    assert "decisions" not in metrics
    assert set(metrics["hit_ratio"]) == {"L0", "L1", "L2", "L3"}
    assert sum(metrics["hit_ratio"].values()) == pytest.approx(1.0, abs=1e-3)


def test_the_cost_model_is_what_charges_time() -> None:
    trace = [TraceRecord(0.0, "t", "a", 32, 8), TraceRecord(5.0, "t", "a", 32, 8)]
    base = cost()
    slow_step = replace(base, step=replace(base.step, per_token_s=base.step.per_token_s * 100))
    slow_front = replace(base, front_s=base.front_s + 0.5)
    ttft = {
        name: simulate(trace, SimConfig(), model).metrics["ttft_ms"]["p50"]
        for name, model in (("base", base), ("step", slow_step), ("front", slow_front))
    }
    assert ttft["step"] > ttft["base"]
    assert ttft["front"] == pytest.approx(ttft["base"] + 500, abs=1e-6)
    # network_s is the ingress-replica hop: charged in a fleet only
    far = replace(base, network_s=1.0)
    one = simulate(trace, SimConfig(), far).metrics["ttft_ms"]["p50"]
    assert one == pytest.approx(ttft["base"], abs=1e-6)
    assert simulate(trace, SimConfig(replicas=2), far).metrics["ttft_ms"]["p50"] >= 1000


def test_prompt_tokens_cost_the_prefill_term_and_decode_tokens_the_token_term() -> None:
    """A warm request's TTFT is front_s + ipc_s + one prefill step of its prompt; its decode
    steps are priced by per_token_s. Without a prefill term (an old file) a prompt token costs
    per_token_s."""
    trace = [TraceRecord(0.0, "t", "a", 32, 8, rank=16), TraceRecord(5.0, "t", "a", 32, 8, rank=16)]
    base = cost()
    assert base.step.per_prefill_token_s is None  # the example file predates the term

    def run(per_token_s: float, per_prefill_token_s: float | None) -> dict[str, float]:
        step = replace(base.step, per_token_s=per_token_s, per_prefill_token_s=per_prefill_token_s)
        metrics = simulate(trace, SimConfig(), replace(base, step=step)).metrics
        return {"ttft": metrics["ttft_ms_warm"]["p50"], "end": metrics["makespan_s"]}

    def warm_ttft_ms(step_s: float) -> float:
        return (base.front_s + base.ipc_s + step_s) * 1000

    token = base.step.per_token_s
    old = run(token, None)
    assert old["ttft"] == pytest.approx(warm_ttft_ms(base.step.seconds(32, 0, 1, 512)), abs=1e-3)
    cheap = run(token, token / 10)
    prefill_s = replace(base.step, per_prefill_token_s=token / 10).seconds(0, 32, 1, 512)
    assert cheap["ttft"] == pytest.approx(warm_ttft_ms(prefill_s), abs=1e-3)
    assert old["ttft"] - cheap["ttft"] == pytest.approx(32 * 0.9 * token * 1000, abs=2e-3)
    # Decode tokens: per_token_s alone moves the end, not the warm prefill.
    slow_decode = run(token * 2, token / 10)
    assert slow_decode["ttft"] == cheap["ttft"]
    assert slow_decode["end"] - cheap["end"] == pytest.approx(7 * token, abs=1e-6)


def test_an_all_linear_adapter_costs_its_bytes_where_the_file_prices_them() -> None:
    """Two adapters of one rank, one with three times the bytes (every linear layer): with the
    weight terms the wider one's warm TTFT is higher by exactly its extra bytes' price; a file
    without them prices the two alike (rank_tokens cannot tell them apart)."""
    narrow, wide = 16 * 4096, 16 * 3 * 4096  # bytes of rank 16
    trace = [
        TraceRecord(0.0, "t", "attn", 32, 4, rank=16, size_bytes=narrow),
        TraceRecord(2.0, "t", "attn", 32, 4, rank=16, size_bytes=narrow),
        TraceRecord(4.0, "t", "all", 32, 4, rank=16, size_bytes=wide),
        TraceRecord(6.0, "t", "all", 32, 4, rank=16, size_bytes=wide),
    ]
    base = cost()
    priced = replace(
        base, step=replace(base.step, per_byte_token_s=1e-11, per_revision_width_s=1e-7)
    )

    def warm_ms(model: CostModel) -> dict[str, float]:
        ttfts = simulate(trace, SimConfig(), model).metrics["ttft_ms_warm"]
        assert ttfts["n"] == 2  # the second request of each adapter: one each
        return {"min": ttfts["p50"], "max": ttfts["p99"]}

    old = warm_ms(base)
    assert old["max"] == pytest.approx(old["min"], abs=1e-6)
    new = warm_ms(priced)
    extra_s = 32 * (wide - narrow) * 1e-11 + (wide - narrow) / 16 * 1e-7
    assert new["max"] - new["min"] == pytest.approx(extra_s * 1000, rel=0.02)


def test_cold_and_warm_ttft_and_failures_count() -> None:
    trace = [TraceRecord(0.0, "t", "a", 32, 4), TraceRecord(2.0, "t", "a", 32, 4)]
    # arrives with "a"'s second request, with the engine queue full: refused by the engine
    trace.append(TraceRecord(2.0, "t", "b", 32, 4))
    trace.append(TraceRecord(3.0, "t", "b", 4096, 4))  # longer than max_model_len: a 400
    metrics = simulate(trace, SimConfig(timeout_s=9.0, max_queue_len=1), cost()).metrics
    assert metrics["ttft_ms_cold"]["n"] == 1 and metrics["ttft_ms_warm"]["n"] == 1
    assert metrics["ttft_ms_cold"]["p50"] > metrics["ttft_ms_warm"]["p50"]
    assert metrics["completed"] == 2 and metrics["errors"] == {"QueueFullError": 1}
    assert metrics["refused"] == {"context_length_exceeded": 1}
    assert metrics["ttft_ms"]["n"] == 3  # the refused request is in no percentile
    assert metrics["ttft_ms"]["p99"] == 9000.0  # the failed request counts at timeout_s
    assert metrics["by_tenant"]["t"]["completed_ratio"] == pytest.approx(2 / 4, abs=1e-4)


def test_an_adapter_above_the_slot_rank_is_refused_naming_it() -> None:
    trace = [TraceRecord(0.0, "t", "big", 8, 2, rank=128)]
    with pytest.raises(ValueError, match="rank 128 of adapter t/big is invalid"):
        simulate(trace, SimConfig(max_lora_rank=64), cost())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("replicas", 0),
        ("routing_policy", "round_robin"),
        ("eviction_policy", "fifo"),
        ("max_loras", True),
        ("report_interval_s", 0.0),
        ("default_rank", 128),
        ("default_tenant_tier_share", 0.0),
        ("default_tenant_tier_share", 1.5),
        ("max_auto_gpu_slots", 8),
        ("auto_warm_interval_s", 0.0),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SimConfig(**{field: value})  # type: ignore[arg-type]


def test_every_request_ends_when_loads_are_scarce() -> None:
    """cold-storm with one load at a time and a short deadline: requests waiting on loads and
    quotas still end (finished or timed out); none is left live."""
    trace = scenario("cold-storm", duration_s=10, rate=40)
    config = SimConfig(
        max_loras=2,
        max_lora_rank=128,
        max_concurrent_loads=1,
        tenant_max_concurrent_loads=1,
        queue_deadline_s=0.5,
    )
    metrics = simulate(trace, config, cost()).metrics
    assert metrics["completed"] + sum(metrics["errors"].values()) == len(trace)
    assert metrics["completed"] > 0 and metrics["errors"]


def test_a_request_ends_when_its_context_is_full() -> None:
    """100 + 28 tokens fill a 128-token context; 100 + 500 is refused at arrival, as the
    server answers it (a 400; before, it ran and ended at 28 tokens: ``test_sim_refusal.py``)."""
    trace = [TraceRecord(0.0, "t", "a", 100, 28), TraceRecord(9.0, "t", "a", 100, 500)]
    metrics = simulate(trace, SimConfig(max_model_len=128), cost()).metrics
    assert metrics["completed"] == 1 and metrics["refused"] == {"context_length_exceeded": 1}
    assert metrics["throughput_tokens_per_s"] == pytest.approx(28 / metrics["makespan_s"], 1e-3)


_RUN_ONE = """
import sys
sys.path.insert(0, {tests!r})
from sim_inputs import cost, scenario
from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
print(simulate(scenario("zipf-longtail", duration_s=5), SimConfig(replicas=3), cost()).to_json())
"""


def test_the_result_does_not_depend_on_the_processs_hash_seed() -> None:
    """Sets of keys and names are ordered per process: no decision may depend on that order."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = _RUN_ONE.format(tests=str(Path(__file__).resolve().parent))
    outputs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout
        for seed in ("1", "2")
    ]
    assert outputs[0] == outputs[1] and outputs[0].startswith("{")


def test_tenant_priorities_reach_the_scheduler_and_the_cache() -> None:
    """hot-burst with the sweep tenant in the batch class: the class caps of the real scheduler
    hold it back behind the high-priority tenant (its TTFT rises)."""
    from loraplex.engine.tenant_shares import TenantSettings

    trace = scenario("hot-burst", duration_s=40)
    classes = {
        "prio": TenantSettings.for_priority("high"),
        "batch": TenantSettings.for_priority("batch"),
    }
    whole = SimConfig(max_loras=6, default_tenant_tier_share=1.0)  # slots held by none
    runs = [simulate(trace, replace(whole, tenants=t), cost()).metrics for t in ({}, classes)]
    plain, ranked = (m["by_tenant"]["batch"]["ttft_ms"]["p50"] for m in runs)
    assert ranked > 2 * plain


def _cycle(adapters: int, rounds: int) -> list[TraceRecord]:
    """One tenant's requests for ``adapters`` adapters in turn, far apart (no overlap)."""
    return [TraceRecord(0.5 * i, "t", f"a{i % adapters}", 8, 2) for i in range(adapters * rounds)]


def test_a_lone_tenant_borrows_every_slot_beyond_its_share() -> None:
    """Four adapters over four slots: with the whole pool they all stay (4 fills); with half of
    it as the share (a server's default_tenant_tier_share, work-conserving) a tenant no one
    else competes with borrows the free slots: they all stay too. Five adapters over four slots
    evict each other either way."""
    runs = {
        (n, s): simulate(
            _cycle(n, 3), SimConfig(max_loras=4, default_tenant_tier_share=s), cost()
        ).metrics
        for n in (4, 5)
        for s in (1.0, 0.5)
    }
    for share in (1.0, 0.5):
        assert runs[4, share]["l0_loads"] == 4 and runs[4, share]["l0_hits"] == 8
        assert runs[5, share]["l0_loads"] == 15 and runs[5, share]["l0_hits"] == 0


def test_automatic_warm_rebalancing_runs_on_the_virtual_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real cache's rebalance runs once per auto_warm_interval_s of steps, and never when
    auto_warm is off."""
    calls: list[float] = []
    real = TieredAdapterCache.rebalance

    def counted(self: TieredAdapterCache) -> object:
        calls.append(self._clock.now())  # type: ignore[attr-defined]
        return real(self)

    monkeypatch.setattr(TieredAdapterCache, "rebalance", counted)
    hot = [TraceRecord(0.05 * i, "t", "hot", 8, 2) for i in range(400)]  # 20/s for 20 s
    config = SimConfig(max_loras=4, auto_warm_interval_s=5.0)
    simulate(hot, config, cost())
    assert [round(t) for t in calls] == [5, 10, 15]
    calls.clear()
    simulate(hot, replace(config, auto_warm=False), cost())
    assert calls == []


def test_loads_delay_the_steps_they_overlap_when_the_cpu_is_shared() -> None:
    """One long request decodes while another tenant's adapter loads: on a CPU-only server
    (load_cpu_shared) the load's stages delay the running request's steps; otherwise not. The
    decisions are the same either way (same steps, same tiers)."""
    trace = [TraceRecord(0.0, "a", "x", 8, 40), TraceRecord(0.05, "b", "y", 8, 2)]
    runs = [
        simulate(trace, SimConfig(), replace(cost(), load_cpu_shared=s)).metrics
        for s in (False, True)
    ]
    alone, shared = runs
    assert shared["engine_steps"] == alone["engine_steps"]
    assert shared["tier_at_lease"] == alone["tier_at_lease"]
    assert shared["by_tenant"]["a"]["ttft_ms"] == alone["by_tenant"]["a"]["ttft_ms"]
    assert shared["makespan_s"] > alone["makespan_s"]
