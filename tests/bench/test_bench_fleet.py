"""``loraplex bench fleet``: its figures (ratios null when undefined, failures at the timeout,
repeats pooled, counters read from the board), the alternating run order, the JSON line and
table, the refusals, and once the whole benchmark in its ``--quick`` form on a real Ray fleet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.bench.fleet.bench import (
    QUICK_SETTINGS,
    FleetBenchConfig,
    run_plan,
    trace_rates,
    warmup_workload,
)
from loraplex.bench.fleet.drive import capacity_batch
from loraplex.bench.fleet.repeats import median_of, spread_of
from loraplex.bench.fleet.report import (
    HEADLINES,
    PolicyRun,
    ReplicaCounters,
    counters_of,
    counters_since,
    decisions_since,
    fleet_json_line,
    fleet_metrics,
    imbalance,
    ratio,
    summarize,
    trace_metrics,
    ttft_ms,
)
from loraplex.bench.fleet.table import fleet_table
from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.workloads import generate
from loraplex.cli import app
from loraplex.residency.ledger import Tier

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0
DEFAULT = "affinity_until_saturated"


def _record(ttft_s: float | None, status: int = 200, error: str | None = None) -> RequestRecord:
    return RequestRecord(0.0, "tenant", "ad0000", "L0", status, ttft_s, None, 16, "r1", error)


def _counters(*triples: tuple[int, int, int]) -> tuple[ReplicaCounters, ...]:
    """(acquires, l0_hits, l0_loads) per replica."""
    return tuple(ReplicaCounters(f"r{i}", *t) for i, t in enumerate(triples))


def _run(
    policy: str,
    records: list[RequestRecord],
    counters: tuple[ReplicaCounters, ...],
    decisions: dict[str, int] | None = None,
    trace: str = "zipf-longtail",
) -> PolicyRun:
    return PolicyRun(trace, policy, tuple(records), counters, decisions or {})


# --- figures -----------------------------------------------------------------------------------


def test_ratio_is_null_when_undefined_never_zero() -> None:
    assert ratio(None, 1.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None  # undefined, not 0 and not infinite
    assert ratio(0.0, 2.0) == 0.0  # defined: the numerator really is 0
    assert ratio(2.0, 3.0) == 0.667
    assert ratio(1000 * 7, 3, 1) == 2333.3


def test_failures_and_timeouts_count_in_the_percentiles_at_the_timeout() -> None:
    fast = [_record(0.1)] * 98
    failed = [_record(None, 503, "queue full"), _record(None, 0, "timeout")]
    # A failure that did stream a first token still counts at least at the timeout.
    broken_stream = [_record(0.05, 200, "engine_error")]
    figures = ttft_ms(fast + failed + broken_stream, TIMEOUT_S)
    assert figures["p50"] == 100.0
    assert figures["p99"] == TIMEOUT_S * 1000
    # Without the failures the same run would look fast: the timeout is what moved P99.
    assert ttft_ms(fast, TIMEOUT_S)["p99"] == 100.0
    assert ttft_ms([], TIMEOUT_S) == {"p50": None, "p90": None, "p99": None}


def test_summarize_gives_medians_over_the_repeats_with_their_spread() -> None:
    first = _run(
        DEFAULT,
        [_record(0.1)] * 9 + [_record(None, 0, "timeout")],
        _counters((6, 3, 3), (4, 1, 3)),
        {"gpu_hit": 4, "placement": 6},
    )
    second = _run(DEFAULT, [_record(0.2)] * 10, _counters((5, 5, 0), (15, 1, 14)), {"gpu_hit": 10})
    third = _run(DEFAULT, [_record(0.3)] * 10, _counters((10, 5, 5), (10, 5, 5)), {"gpu_hit": 1})
    s = summarize([first, second, third], TIMEOUT_S)
    # Counts and decisions are summed over the repeats.
    assert (s["runs"], s["requests"], s["completed"]) == (3, 30, 29)
    assert (s["acquires"], s["l0_hits"], s["l0_loads"]) == (50, 20, 30)
    assert s["decisions"] == {"gpu_hit": 15, "placement": 6}
    # Each figure is the median of the repeats' own (hit ratios 0.4, 0.3, 0.5), not the pooled
    # 20 / 50, and its spread is their min and max.
    assert s["l0_hit_ratio"] == 0.4 and s["spread"]["l0_hit_ratio"] == [0.3, 0.5]
    assert s["completed_ratio"] == 1.0 and s["spread"]["completed_ratio"] == [0.9, 1.0]
    assert s["cold_loads_per_1k_requests"] == 1000.0
    assert s["spread"]["cold_loads_per_1k_requests"] == [600.0, 1400.0]
    assert s["imbalance"] == 1.2 and s["spread"]["imbalance"] == [1.0, 1.5]
    # The first repeat's timeout is its own P99 (the timeout); the median P99 is the third's,
    # and the spread shows the bad repeat.
    assert s["ttft_ms"]["p99"] == 300.0
    assert s["spread"]["ttft_ms"]["p99"] == [200.0, TIMEOUT_S * 1000]
    assert s["ttft_ms"]["p50"] == 200.0 and s["spread"]["ttft_ms"]["p50"] == [100.0, 300.0]


def test_a_repeat_with_an_undefined_figure_leaves_it_undefined() -> None:
    assert median_of([1.0, None, 3.0]) is None and spread_of([1.0, None]) is None
    assert median_of([]) is None and spread_of([]) is None
    assert median_of([1.0, 2.0]) == 1.5  # an even count: the mean of the middle two
    defined = _run("pow2", [_record(0.1)], _counters((2, 1, 1)))
    empty = _run("pow2", [_record(0.1)], _counters((0, 0, 0)))  # no acquires: no hit ratio
    s = summarize([defined, empty], TIMEOUT_S)
    assert s["l0_hit_ratio"] is None and s["spread"]["l0_hit_ratio"] is None
    assert s["ttft_ms"]["p99"] == 100.0  # defined in both repeats


def test_summarize_without_acquires_or_requests_gives_nulls() -> None:
    s = summarize([_run("pow2", [], _counters((0, 0, 0), (0, 0, 0)))], TIMEOUT_S)
    assert s["l0_hit_ratio"] is None
    assert s["completed_ratio"] is None
    assert s["cold_loads_per_1k_requests"] is None
    assert s["imbalance"] is None
    assert s["ttft_ms"]["p99"] is None
    assert imbalance(()) is None


def _figures(l0: float | None, p99: float | None, completed: float = 1.0) -> dict[str, Any]:
    """One repeat's figures (``repeat_figures``' keys)."""
    return {
        "requests": 10,
        "completed": 10,
        "acquires": 10,
        "l0_hits": 5,
        "l0_loads": 1,
        "l0_hit_ratio": l0,
        "ttft_ms": {"p50": None, "p90": None, "p99": p99},
        "completed_ratio": completed,
        "cold_loads_per_1k_requests": 100.0,
        "imbalance": 1.0,
    }


def test_headline_ratios_and_their_nulls() -> None:
    full = {
        "pow2": [_figures(0.2, 900.0)],
        "ray_multiplex": [_figures(0.4, 600.0)],
        "affinity": [_figures(0.6, 1200.0, completed=0.9)],
        DEFAULT: [_figures(0.5, 300.0)],
    }
    m = trace_metrics(full, {"pow2": {"pow2": 10}})
    assert m["l0_hit_ratio_over_pow2"] == 2.5
    assert m["l0_hit_ratio_over_ray_multiplex"] == 1.25
    assert m["p99_ttft_pow2_over_default"] == 3.0
    assert m["p99_ttft_affinity_over_default"] == 4.0
    assert m["completed_ratio"]["affinity"] == 0.9
    assert m["policies"]["pow2"]["decisions"] == {"pow2": 10}
    assert m["policies"][DEFAULT]["decisions"] == {}
    # The headlines come first, then their spreads and per-repeat values, then the rest.
    assert list(m)[: len(HEADLINES) + 3] == [
        *(h.name for h in HEADLINES),
        "spread",
        "per_repeat",
        "completed_ratio",
    ]
    # A policy that did not run, a zero denominator, an undefined side: null, never 0.
    partial = trace_metrics({"pow2": [_figures(0.0, None)], DEFAULT: [_figures(0.5, 300.0)]})
    assert partial["l0_hit_ratio_over_pow2"] is None
    assert partial["p99_ttft_pow2_over_default"] is None
    assert partial["l0_hit_ratio_over_ray_multiplex"] is None
    assert partial["spread"]["l0_hit_ratio_over_ray_multiplex"] is None
    assert partial["p99_ttft_affinity_over_default"] is None
    zero = trace_metrics({"pow2": [_figures(0.2, 300.0)], DEFAULT: [_figures(0.0, 300.0)]})
    assert zero["l0_hit_ratio_over_pow2"] == 0.0


def test_headline_ratios_pair_the_repeats_and_take_the_median() -> None:
    figures = {
        "pow2": [_figures(0.2, 900.0), _figures(0.1, 400.0), _figures(0.3, 3000.0)],
        DEFAULT: [_figures(0.4, 300.0), _figures(0.4, 400.0), _figures(0.3, 1000.0)],
    }
    m = trace_metrics(figures)
    # Repeat k over repeat k: 3.0, 1.0, 3.0 (the ratio of the medians would be 900 / 400).
    assert m["per_repeat"]["p99_ttft_pow2_over_default"] == [3.0, 1.0, 3.0]
    assert m["p99_ttft_pow2_over_default"] == 3.0
    assert m["spread"]["p99_ttft_pow2_over_default"] == [1.0, 3.0]
    assert m["per_repeat"]["l0_hit_ratio_over_pow2"] == [2.0, 4.0, 1.0]
    assert m["l0_hit_ratio_over_pow2"] == 2.0
    # Unequal repeat counts cannot be paired: null.
    uneven = trace_metrics({"pow2": figures["pow2"][:2], DEFAULT: figures[DEFAULT]})
    assert uneven["p99_ttft_pow2_over_default"] is None


def test_counters_come_from_the_board_status() -> None:
    summary = SimpleNamespace(stats=SimpleNamespace(loads={Tier.L0: 7, Tier.L1: 3}))
    status = {
        "replica_id": "abc",
        "hits": {"l0": 5, "l1": 2, "l2": 1, "miss": 4},
        "summary": summary,
    }
    assert counters_of(status) == ReplicaCounters("abc", acquires=12, l0_hits=5, l0_loads=7)


def test_measured_counters_and_decisions_leave_the_warm_up_out() -> None:
    before = _counters((10, 4, 6), (3, 1, 2))
    after = (*_counters((15, 8, 7), (3, 1, 2)), ReplicaCounters("joined", 2, 0, 2))
    assert counters_since(after, before) == (
        ReplicaCounters("r0", 5, 4, 1),
        ReplicaCounters("r1", 0, 0, 0),
        ReplicaCounters("joined", 2, 0, 2),  # absent before the replay: counts from 0
    )
    assert counters_since(after, ()) == after  # no warm-up: the totals
    decided = decisions_since(
        {"gpu_hit": 9, "placement": 4, "saturated": 1}, {"gpu_hit": 5, "placement": 4}
    )
    assert decided == {"gpu_hit": 4, "saturated": 1}


def test_the_warm_up_is_the_traces_steady_traffic_from_another_seed() -> None:
    config = FleetBenchConfig(warmup_requests=120)
    measured = generate("hot-burst", config.seed, config.params(10.0, 12.0))
    warmup = warmup_workload("hot-burst", config, 10.0)
    assert warmup is not None and warmup.seed == config.seed + 1
    assert warmup.duration_s == 12.0  # 120 requests at 10 req/s
    assert {r.tenant for r in warmup.requests} == {"prio"}  # no batch sweep
    assert {r.tenant for r in measured.requests} == {"prio", "batch"}
    zipf = warmup_workload("zipf-longtail", config, 10.0)
    assert zipf is not None and 80 < len(zipf.requests) < 160  # Poisson around 120
    first = generate("zipf-longtail", config.seed, config.params(10.0, 12.0))
    assert [r.t_s for r in zipf.requests] != [r.t_s for r in first.requests]
    assert warmup_workload("zipf-longtail", FleetBenchConfig(warmup_requests=0), 10.0) is None
    # hot-one is steady throughout: its warm-up is all of it, hot revision and tail.
    hot_one = warmup_workload("hot-one", config, 10.0)
    assert hot_one is not None and {r.tenant for r in hot_one.requests} == {"hot", "tail"}


# --- run order, config, output -----------------------------------------------------------------


def test_policies_alternate_between_repeats_and_traces() -> None:
    plan = run_plan(("zipf-longtail", "hot-burst"), ("a", "b", "c", "d"), 2)
    names = [f"{t}/{p}" for t, p in plan]
    zipf = [p for t, p in plan if t == "zipf-longtail"]
    burst = [p for t, p in plan if t == "hot-burst"]
    assert zipf == ["a", "b", "c", "d", "d", "c", "b", "a"]
    assert burst == ["d", "c", "b", "a", "a", "b", "c", "d"]
    assert names[:4] == [f"zipf-longtail/{p}" for p in "abcd"]  # one trace at a time
    assert run_plan(("hot-burst",), ("a", "b"), 3) == [
        ("hot-burst", p) for p in ("a", "b", "b", "a", "a", "b")
    ]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"traces": ("uniform",)}, "traces"),
        ({"traces": ()}, "traces"),
        ({"policies": ("pow2", "pow2")}, "policies"),
        ({"policies": ("round_robin",)}, "policies"),
        ({"repeats": 0}, "repeats"),
        ({"replicas": True}, "replicas"),
        ({"max_loras": 0}, "max_loras"),
        ({"rate": 0.0}, "rate"),
        ({"load": -1.0}, "load"),
        ({"hot_load": 0.0}, "hot_load"),
        ({"request_timeout_s": 0.0}, "request_timeout_s"),
        ({"warmup_requests": -1}, "warmup_requests"),
        ({"warmup_requests": 1.5}, "warmup_requests"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        FleetBenchConfig(**changes)


def test_defaults_run_three_traces_three_times() -> None:
    config = FleetBenchConfig()
    assert config.traces == ("zipf-longtail", "hot-burst", "hot-one")
    assert config.repeats == 3 and config.hot_load == 1.5


def test_hot_one_rate_makes_its_hot_revision_ask_hot_load_replicas() -> None:
    config = FleetBenchConfig(replicas=3, load=0.5, hot_load=1.8)
    rates = trace_rates(config, 40.0)
    assert rates["zipf-longtail"] == rates["hot-burst"] == 20.0  # load x capacity
    # 60 % of hot-one's requests ask 1.8 x (40 / 3 replicas) = 24 req/s: 40 req/s in all.
    assert rates["hot-one"] == pytest.approx(40.0)
    trace = generate("hot-one", 0, config.params(rates["hot-one"], 300.0))
    hot = sum(r.tenant == "hot" for r in trace.requests) / trace.duration_s
    assert hot / (40.0 / 3) == pytest.approx(1.8, rel=0.05)
    # A given rate is every trace's rate; without one, a capacity is needed.
    fixed = FleetBenchConfig(rate=5.0)
    assert trace_rates(fixed, None) == dict.fromkeys(fixed.traces, 5.0)
    with pytest.raises(RuntimeError, match="capacity"):
        trace_rates(config, None)


def test_quick_settings_are_a_valid_config() -> None:
    config = FleetBenchConfig(**QUICK_SETTINGS)
    assert config.repeats == 1 and config.rate is not None
    assert set(config.policies) == {"pow2", DEFAULT}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--policies", "pow2,nope"], "policies"),
        (["--traces", "uniform"], "traces"),
        (["--threads", "0"], "torch_threads"),
        (["--rate", "2", "--load", "0.4"], "--load"),  # the rate would ignore the load
        (["--quick", "--load", "0.4"], "--load"),
        (["--rate", "2", "--hot-load", "2"], "--hot-load"),  # the rate would ignore it
        (["--quick", "--hot-load", "2"], "--hot-load"),
        (["--traces", "hot-one", "--hot-load", "-1"], "hot_load"),
        (["--traces", "zipf-longtail", "--hot-load", "2"], "--hot-load"),  # no hot-one: unread
        (["--traces", "hot-one", "--load", "0.4"], "--load"),  # hot-one's rate ignores it
    ],
)
def test_cli_refuses_bad_options_before_running_anything(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["bench", "fleet", "--json", *args])
    assert result.exit_code == 2, result.output
    assert named in result.output


def test_capacity_batch_cycles_over_the_adapters() -> None:
    batch = capacity_batch([("t", "a"), ("t", "b")], 5, 64, 16)
    assert [r.adapter for r in batch] == ["a", "b", "a", "b", "a"]
    assert {r.t_s for r in batch} == {0.0}
    with pytest.raises(ValueError, match="adapters"):
        capacity_batch([], 5, 64, 16)


def test_json_line_and_table_show_every_policy_and_nulls() -> None:
    runs = [
        _run("pow2", [_record(0.3)] * 4, _counters((4, 1, 3)), {"pow2": 4}),
        _run(DEFAULT, [_record(0.1)] * 4, _counters((4, 3, 1)), {"gpu_hit": 3, "placement": 1}),
        _run("pow2", [_record(0.5)] * 4, _counters((4, 2, 2)), {"pow2": 4}),
        _run(DEFAULT, [_record(0.1)] * 4, _counters((4, 3, 1)), {"gpu_hit": 4}),
    ]
    metrics = fleet_metrics(runs, ("zipf-longtail", "hot-burst"), ("pow2", DEFAULT), TIMEOUT_S)
    metrics["trace_rate"] = 3.0
    config = {"traces": ["zipf-longtail", "hot-burst"]}
    result = {"name": "fleet", "config": config, "seed": 0, "metrics": metrics, "runs": runs}
    line = fleet_json_line(result)
    assert "\n" not in line and "NaN" not in line
    parsed = json.loads(line)
    assert set(parsed) == {"name", "config", "seed", "metrics"}  # runs stay out of the line
    zipf = parsed["metrics"]["zipf-longtail"]
    assert zipf["per_repeat"]["l0_hit_ratio_over_pow2"] == [3.0, 1.5]
    assert zipf["l0_hit_ratio_over_pow2"] == 2.25
    assert zipf["spread"]["p99_ttft_pow2_over_default"] == [3.0, 5.0]
    assert zipf["l0_hit_ratio_over_ray_multiplex"] is None
    assert zipf["policies"]["pow2"]["decisions"] == {"pow2": 8}
    assert parsed["metrics"]["hot-burst"]["policies"] == {}  # no run: no figures, all null
    assert parsed["metrics"]["hot-burst"]["l0_hit_ratio_over_pow2"] is None
    table = fleet_table(result)
    assert "zipf-longtail:" in table and "hot-burst:" in table
    assert "pow2" in table and DEFAULT in table
    assert "null" in table
    assert "decisions affinity_until_saturated: gpu_hit 7, placement 1" in table
    assert "0.375 [0.25-0.5]" in table  # pow2's median L0 hit ratio and its spread
    assert "400 [300-500]" in table  # pow2's median P99 TTFT and its spread
    assert "4 [3-5]" in table  # the headline P99 ratio and its spread


# --- the whole benchmark -----------------------------------------------------------------------


TRACE_REQUESTS, RATE = 16, 6.0  # the quick run's 32 requests at 3 per second, halved


@pytest.mark.slow  # a local Ray cluster and two fleet deployments: about a minute
@pytest.mark.ray  # its own cluster, in the bench's process
def test_quick_run_on_a_real_fleet(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-c",
        "from loraplex.cli import main; main()",
        # No warm-up: every fleet starts cold, so each adapter of the trace must be loaded in the
        # measured replay (below); the warm-up's subtraction is tested on its own above.
        *("bench", "fleet", "--quick", "--json", "--warmup-requests", "0"),
        # Half the quick trace at twice its rate, on two replicas: a shorter replay and fewer
        # engines to start; every figure checked below is still there to check.
        *("--trace-requests", str(TRACE_REQUESTS), "--rate", str(RATE), "--replicas", "2"),
        *("--asset-dir", str(REPO_ROOT / ".loraplex-assets")),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout[-2000:]  # --json: the JSON line alone on stdout
    result = json.loads(lines[0])
    assert result["name"] == "fleet"
    assert result["config"]["machine"]["cores"] >= 1  # the harness's machine record (issue 26)
    metrics = result["metrics"]
    assert metrics["run_order"] == [f"zipf-longtail/{p}" for p in QUICK_SETTINGS["policies"]]
    assert result["config"]["replicas"] == 2
    assert metrics["trace_rate"] == {"zipf-longtail": RATE}
    assert metrics["trace_duration_s"] == {"zipf-longtail": round(TRACE_REQUESTS / RATE, 2)}
    config = FleetBenchConfig(**QUICK_SETTINGS)
    trace = generate("zipf-longtail", 0, config.params(RATE, TRACE_REQUESTS / RATE))
    distinct = len({r.adapter for r in trace.requests})
    zipf = metrics["zipf-longtail"]
    assert list(zipf["policies"]) == list(QUICK_SETTINGS["policies"])
    for policy, s in zipf["policies"].items():
        assert s["requests"] == len(trace.requests), policy
        assert s["completed"] > 0, policy
        assert s["completed_ratio"] == round(s["completed"] / s["requests"], 4)
        # Every completed request acquired its adapter on some replica.
        assert s["completed"] <= s["acquires"], policy
        # Fresh replicas per run: every adapter of the trace was loaded at least once.
        assert s["l0_loads"] >= distinct, policy
        assert s["l0_hit_ratio"] == round(s["l0_hits"] / s["acquires"], 4)
        assert s["ttft_ms"]["p50"] is not None and s["ttft_ms"]["p99"] >= s["ttft_ms"]["p50"]
        # The router decided each request of this run only (a fresh ingress per run).
        assert s["completed"] <= sum(s["decisions"].values()) <= 2 * s["requests"], policy
    assert set(zipf["policies"]["pow2"]["decisions"]) == {"pow2"}
    assert not {"pow2", "multiplex"} & set(zipf["policies"][DEFAULT]["decisions"])
    pow2, default = zipf["policies"]["pow2"], zipf["policies"][DEFAULT]
    assert zipf["l0_hit_ratio_over_pow2"] == ratio(default["l0_hit_ratio"], pow2["l0_hit_ratio"])
    assert zipf["p99_ttft_pow2_over_default"] == ratio(
        pow2["ttft_ms"]["p99"], default["ttft_ms"]["p99"]
    )
    # Policies that did not run leave their ratios null.
    assert zipf["l0_hit_ratio_over_ray_multiplex"] is None
    assert zipf["p99_ttft_affinity_over_default"] is None
