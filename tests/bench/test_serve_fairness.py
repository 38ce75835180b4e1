"""The serve benchmark's fairness rules on synthetic records (no server): failures count in the
percentiles at the timeout, undefined ratios are null, completed ratios stand beside the
headlines, hot-burst reports the price beside the gain at every capacity point, trace runs
alternate their order and pool their repeats, and the throughput ratio is null when undefined."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest
from report_rows import row_cells

from loraplex.bench.harness.order import run_order
from loraplex.bench.serve.config import ServeBenchConfig
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, ResidencyView
from loraplex.bench.serve.fleet import ServerOptions, drop_page_cache
from loraplex.bench.serve.report import serve_markdown
from loraplex.bench.serve.runs import comparisons, pooled_view
from loraplex.bench.serve.summary import (
    RunResult,
    headline,
    hot_burst_policies,
    hot_burst_run,
    summarize,
    ttft_or_timeout,
)
from loraplex.bench.serve.throughput import ThroughputResult
from loraplex.bench.workloads import Workload

TIMEOUT_S = 10.0
HOT_BURST_POLICIES = hot_burst_policies()  # the default candidates and the two baselines


def _record(
    tenant: str, ttft_s: float | None, status: int = 200, t_s: float = 1.0
) -> RequestRecord:
    error = None if status == 200 and ttft_s is not None else "timeout"
    return RequestRecord(t_s, tenant, "a", "L0", status, ttft_s, None, 4, "r1", error)


def _run(name: str, records: list[RequestRecord], burst_s: float | None = None) -> RunResult:
    return RunResult(name, tuple(records), ResidencyView(), TIMEOUT_S, burst_s)


def test_a_failed_or_timed_out_request_counts_at_least_the_timeout() -> None:
    assert ttft_or_timeout(_record("t", 0.2), TIMEOUT_S) == 0.2
    assert ttft_or_timeout(_record("t", None, status=0), TIMEOUT_S) == TIMEOUT_S
    assert ttft_or_timeout(_record("t", None, status=503), TIMEOUT_S) == TIMEOUT_S
    # An error after the first token took longer than the timeout: the larger value counts.
    assert ttft_or_timeout(_record("t", 12.0, status=0), TIMEOUT_S) == 12.0


def test_percentiles_include_failures_and_the_completed_ratio_is_reported() -> None:
    records = [_record("steady-a", 0.1) for _ in range(90)]
    records += [_record("steady-a", None, 503) for _ in range(10)]
    summary = summarize(_run("x", records))
    assert summary["ttft_ms"]["n"] == 100
    assert summary["ttft_ms"]["p50"] == 100.0
    assert summary["ttft_ms"]["p99"] == TIMEOUT_S * 1000  # the shed requests are the tail
    assert summary["completed"] == 90 and summary["completed_ratio"] == 0.9
    assert summary["by_tenant"]["steady-a"]["completed_ratio"] == 0.9
    # Survivorship: the same run without the failures would have looked uniformly fast.
    assert summarize(_run("y", records[:90]))["ttft_ms"]["p99"] == 100.0


def _burst_runs(slots: int, batch_ttft: dict[str, float]) -> dict[str, dict[str, object]]:
    out = {}
    for policy in HOT_BURST_POLICIES:
        hot_s = {"cost_aware": 0.05, "admit_gdsf": 0.04}.get(policy, 0.2)
        records = [_record("prio", hot_s, t_s=5.0)] * 4
        records += [_record("batch", batch_ttft[policy], t_s=5.0)] * 3
        records += [_record("batch", None, status=0, t_s=5.0)] if policy == "cost_aware" else []
        out[hot_burst_run(slots, policy)] = summarize(_run("r", records, burst_s=3.0))
    return out


def test_hot_burst_reports_gain_and_price_with_completed_ratios_beside() -> None:
    summaries = {
        **_burst_runs(9, {"lru": 0.1, "lru_priority": 0.2, "cost_aware": 0.3, "admit_gdsf": 0.15}),
        **_burst_runs(12, dict.fromkeys(HOT_BURST_POLICIES, 0.1)),
    }
    metrics = headline(summaries, (9, 12))
    assert metrics["hot_burst_p99_ttft_lru_over_cost_aware"] == 4.0
    assert metrics["hot_burst_p99_ttft_lru_priority_over_cost_aware"] == 4.0
    # Batch P50 under cost_aware: 3 x 0.3 s and one timeout -> median 0.3 s (lru 0.1 s).
    assert metrics["hot_burst_batch_p50_ttft_cost_aware_over_lru"] == 3.0
    assert metrics["hot_burst_batch_p50_ttft_cost_aware_over_lru_priority"] == 1.5
    assert metrics["hot_burst_batch_completed_ratio_cost_aware"] == 0.75
    assert metrics["hot_burst_batch_completed_ratio_lru"] == 1.0
    # The second candidate against the same baselines, in the same run.
    assert metrics["hot_burst_p99_ttft_lru_over_admit_gdsf"] == 5.0
    assert metrics["hot_burst_p99_ttft_lru_priority_over_admit_gdsf"] == 5.0
    assert metrics["hot_burst_batch_p50_ttft_admit_gdsf_over_lru"] == 1.5
    assert metrics["hot_burst_batch_p50_ttft_admit_gdsf_over_lru_priority"] == 0.75
    keys = list(metrics)
    gain = keys.index("hot_burst_p99_ttft_lru_priority_over_admit_gdsf")
    assert keys[gain + 1 : gain + 1 + len(HOT_BURST_POLICIES)] == [
        f"hot_burst_hot_completed_ratio_{p}" for p in HOT_BURST_POLICIES
    ]
    assert metrics["hot_burst_slots"] == 9
    assert set(metrics["hot_burst_sweep"]) == {"9", "12"}
    assert metrics["hot_burst_sweep"]["12"]["hot_burst_batch_p50_ttft_cost_aware_over_lru"] == 1.0
    # The report's sweep table has each candidate's gain and price per capacity point.
    result = {"name": "serve", "config": {}, "seed": 0, "metrics": {**metrics, "runs": summaries}}
    page = serve_markdown(result, "cdf.png", "hits.png")
    cells = row_cells(page, "| slots |", "| 9 |")
    assert cells["gain_lru_over_admit_gdsf"] == "5.000"
    assert cells["price_admit_gdsf_over_lru"] == "1.500"


def test_hot_burst_candidates_are_chosen_per_run() -> None:
    """``--hot-burst-candidates``: the runs, the ratios and the report follow the choice."""
    candidates = ("tiered_gdsf_fetch",)
    burst = Workload("hot-burst", 0, 10.0, (), ())
    groups = comparisons(
        {"hot-burst": burst}, (9,), 16, lambda p, n: ServerOptions(p, n, 1 << 20), candidates
    )
    assert [name for name, _, _ in groups[0]] == [
        "hot-burst@9/lru", "hot-burst@9/lru_priority", "hot-burst@9/tiered_gdsf_fetch"
    ]  # fmt: skip
    assert groups[0][-1][2] == ServerOptions("tiered_gdsf_fetch", 9, 1 << 20)
    hot = {"lru": 0.2, "lru_priority": 0.1, "tiered_gdsf_fetch": 0.05}
    summaries = {
        hot_burst_run(9, p): summarize(
            _run(
                "r", [_record("prio", hot[p], t_s=5.0)] * 4 + [_record("batch", 0.1, t_s=5.0)], 3.0
            )
        )
        for p in hot
    }
    metrics = headline(summaries, (9,), candidates)
    assert metrics["hot_burst_p99_ttft_lru_over_tiered_gdsf_fetch"] == 4.0
    assert metrics["hot_burst_p99_ttft_lru_priority_over_tiered_gdsf_fetch"] == 2.0
    assert not any("cost_aware" in key for key in metrics)  # not run: not reported
    config = {"hot_burst_candidates": list(candidates)}
    result = {
        "name": "serve",
        "config": config,
        "seed": 0,
        "metrics": {**metrics, "runs": summaries},
    }
    header = next(
        line for line in serve_markdown(result, "c.png", "h.png").splitlines()
        if line.startswith("| slots |")
    )  # fmt: skip
    assert "gain_lru_over_tiered_gdsf_fetch" in header and "cost_aware" not in header
    with pytest.raises(ValueError, match="hot_burst_candidates"):
        ServeBenchConfig(hot_burst_candidates=("lru",))  # a baseline, not a candidate
    with pytest.raises(ValueError, match="hot_burst_candidates"):
        ServeBenchConfig(hot_burst_candidates=("nope",))
    with pytest.raises(ValueError, match="hot_burst_candidates"):
        ServeBenchConfig(hot_burst_candidates=())


def test_undefined_ratios_are_null_never_zero() -> None:
    only_lru = {hot_burst_run(9, "lru"): summarize(_run("r", [_record("prio", 0.1, t_s=5.0)], 3.0))}
    metrics = headline(only_lru, (9,))
    assert metrics["hot_burst_p99_ttft_lru_over_cost_aware"] is None
    assert metrics["hot_burst_batch_p50_ttft_cost_aware_over_lru"] is None  # no batch request
    assert metrics["hot_burst_hot_completed_ratio_cost_aware"] is None
    assert ThroughputResult((5.0,), (), 0).ratio is None
    assert ThroughputResult((5.0,), (0.0,), 0).ratio is None
    assert ThroughputResult((5.0,), (4.0,), 0).ratio == 1.25
    assert ThroughputResult((5.0,), (4.0,), 0).capacity is None


def test_storm_ratios_count_steady_failures_and_report_completed_ratios() -> None:
    calm = [_record("steady-a", 0.1)] * 10
    storm = [_record("steady-a", 0.1)] * 9 + [_record("steady-b", None, status=0)]
    metrics = headline({"cold-storm/storm": summarize(_run("s", storm)),
                        "cold-storm/no-storm": summarize(_run("c", calm))})  # fmt: skip
    assert metrics["storm_steady_completed_ratio_storm"] == 0.9
    assert metrics["storm_steady_completed_ratio_no_storm"] == 1.0
    assert metrics["storm_warm_p99_ttft_ratio"] > 1.0  # the timed-out steady request counts


def test_trace_runs_alternate_their_order_abba() -> None:
    assert run_order([2], 2) == [(0, 0), (0, 1), (0, 1), (0, 0)]
    assert run_order([2, 3], 1) == [(0, 0), (0, 1), (1, 2), (1, 1), (1, 0)]
    order = run_order([3], 4)
    firsts = [m for i, (_, m) in enumerate(order) if i % 3 == 0]
    assert firsts == [0, 2, 0, 2]


def test_repeats_pool_their_cache_counters() -> None:
    a = ResidencyView(final={"hits": {"L0": 3, "L1": 1}, "misses": 2, "evictions": {"L0": 1}})
    b = ResidencyView(final={"hits": {"L0": 5}, "misses": 1, "evictions": {"L0": 2, "L1": 1}})
    pooled = pooled_view([a, b]).final
    assert pooled["hits"] == {"L0": 8, "L1": 1}
    assert pooled["misses"] == 3
    assert pooled["evictions"] == {"L0": 3, "L1": 1}


def test_drop_page_cache_leaves_the_store_intact(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "obj").write_bytes(b"x" * 10_000)
    assert drop_page_cache(tmp_path) is True  # Linux: posix_fadvise exists
    assert (tmp_path / "sub" / "obj").read_bytes() == b"x" * 10_000


def test_hot_burst_slots_and_repeats_are_validated() -> None:
    with pytest.raises(ValueError, match="hot_burst_slots"):
        ServeBenchConfig(hot_burst_slots=())
    with pytest.raises(ValueError, match="hot_burst_slots"):
        ServeBenchConfig(hot_burst_slots=(9, 0))
    with pytest.raises(ValueError, match="trace_repeats"):
        ServeBenchConfig(trace_repeats=0)
    assert ServeBenchConfig().hot_burst_slots[0] == 9  # the headline point: hot set + 1


def test_each_trace_run_keeps_its_own_request_log_and_client_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``logs_dir`` every run (repeats too) gets a server request log of its own and the
    client's records beside it; without, no server is asked for a log."""
    import contextlib
    import json

    from loraplex.bench.serve import runs as runs_module
    from loraplex.bench.serve.runs import TracePlan, trace_runs

    asked: list[Path | None] = []

    @contextlib.contextmanager
    def fake_serving(fleet: object, data_dir: Path, options: ServerOptions):  # type: ignore[no-untyped-def]
        asked.append(options.request_log_path)
        yield "http://127.0.0.1:1"

    async def fake_replay(*args: object) -> tuple[list[RequestRecord], ResidencyView]:
        return [_record("prio", 0.25)], ResidencyView()

    monkeypatch.setattr(runs_module, "serving", fake_serving)
    monkeypatch.setattr(runs_module, "replay_over_http", fake_replay)
    monkeypatch.setattr(runs_module, "drop_page_cache", lambda store: True)

    class _Fleet:
        store = tmp_path / "store"
        keys = MappingProxyType({})
        admin_key = ""

    workload = Workload("hot-burst", 0, 10.0, (), ())
    group = [
        (f"hot-burst@9/{p}", workload, ServerOptions(p, 9, 1 << 20)) for p in ("lru", "admit_gdsf")
    ]
    logs = tmp_path / "logs"
    logs.mkdir()
    plan = TracePlan([group], 2, TIMEOUT_S, logs)
    trace_runs(plan, _Fleet(), DriveConfig(), tmp_path)  # type: ignore[arg-type]
    assert asked == [
        logs / "run00-hot-burst@9-lru.requests.jsonl",
        logs / "run01-hot-burst@9-admit_gdsf.requests.jsonl",
        logs / "run02-hot-burst@9-admit_gdsf.requests.jsonl",
        logs / "run03-hot-burst@9-lru.requests.jsonl",
    ]
    clients = sorted(p.name for p in logs.glob("*.client.jsonl"))
    assert clients == [p.name.replace(".requests.", ".client.") for p in sorted(asked)]  # type: ignore[union-attr]
    line = json.loads((logs / "run00-hot-burst@9-lru.client.jsonl").read_text())
    assert line["tenant"] == "prio" and line["ttft_s"] == 0.25
    asked.clear()
    trace_runs(TracePlan([group], 1, TIMEOUT_S), _Fleet(), DriveConfig(), tmp_path)  # type: ignore[arg-type]
    assert asked == [None, None]


def test_a_logs_dir_needs_a_trace_scenario(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="logs_dir"):
        ServeBenchConfig(scenarios=("adversarial",), logs_dir=tmp_path)
    assert ServeBenchConfig(scenarios=("hot-burst",), logs_dir=tmp_path).logs_dir == tmp_path


def test_the_tenant_tier_share_reaches_the_trace_runs_only() -> None:
    from loraplex.bench.serve.bench import _options, _trace_options

    with pytest.raises(ValueError, match="tenant_tier_share"):
        ServeBenchConfig(tenant_tier_share=0.0)
    with pytest.raises(ValueError, match="tenant_tier_share"):
        ServeBenchConfig(tenant_tier_share=1.5)
    config = ServeBenchConfig(tenant_tier_share=1.0)
    assert _trace_options(config, "lru", 9).default_tenant_tier_share == 1.0
    assert _options(config, "lru", 9).default_tenant_tier_share is None  # capacity, throughput
    assert _trace_options(ServeBenchConfig(), "lru", 9).default_tenant_tier_share is None
