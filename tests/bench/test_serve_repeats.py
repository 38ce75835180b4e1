"""``bench serve``'s hot-burst figures per repeat (median [min-max]) and its TTFT CDF per tenant,
on synthetic records (no server): each repeat stays apart through the trace runs, a ratio is
taken within a repeat before it is spread, failures count at the timeout, and the hot tenant's
requests before the sweep stay out of its figures."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from report_rows import row_cells

from loraplex.bench.harness.stats import median_min_max
from loraplex.bench.serve import runs as runs_module
from loraplex.bench.serve.driver import RequestRecord, ResidencyView
from loraplex.bench.serve.fleet import ServerOptions
from loraplex.bench.serve.repeats import hot_burst_spread, tenant_ttft_ms
from loraplex.bench.serve.report import (
    hit_ratio_lines,
    hit_ratio_plot,
    hot_burst_tenant_cdf_plot,
    serve_markdown,
)
from loraplex.bench.serve.runs import TracePlan, trace_runs
from loraplex.bench.serve.summary import RunResult, hot_burst_run
from loraplex.bench.workloads import Workload

TIMEOUT_S = 10.0
BURST_S = 3.0
CANDIDATES = ("cost_aware",)


def _record(tenant: str, ttft_s: float | None, t_s: float = 5.0) -> RequestRecord:
    status, error = (200, None) if ttft_s is not None else (0, "timeout")
    return RequestRecord(t_s, tenant, "a", "L0", status, ttft_s, None, 4, "r1", error)


def _repeat(hot: list[float | None], batch_s: float) -> RunResult:
    records = [_record("prio", s) for s in hot] + [_record("batch", batch_s)] * 3
    records.append(_record("prio", 9.0, t_s=1.0))  # before the sweep: not the hot figures
    view = ResidencyView(final={"hits": {"L0": 3}, "misses": 1})
    return RunResult("r", tuple(records), view, TIMEOUT_S, BURST_S)


def _pooled(slots: int, policy: str, repeats: list[RunResult]) -> RunResult:
    records = tuple(r for rep in repeats for r in rep.records)
    return RunResult(
        hot_burst_run(slots, policy), records, ResidencyView(), TIMEOUT_S, BURST_S, tuple(repeats)
    )


def _runs() -> list[RunResult]:
    # Hot P99 per repeat: lru 0.3 / 0.6 / 0.9 s; cost_aware 0.1 / 0.1 / a timed-out request.
    lru = [_repeat([s] * 4, 0.1) for s in (0.3, 0.6, 0.9)]
    prio = [_repeat([0.2] * 4, 0.1) for _ in range(3)]
    cost = [_repeat([0.1] * 4, 0.2), _repeat([0.1] * 4, 0.3), _repeat([0.1] * 3 + [None], 0.2)]
    return [
        _pooled(9, "lru", lru),
        _pooled(9, "lru_priority", prio),
        _pooled(9, "cost_aware", cost),
    ]


def test_median_min_max_is_undefined_when_any_repeat_is() -> None:
    assert median_min_max([3.0, 1.0, 2.0]) == [2.0, 1.0, 3.0]
    assert median_min_max([1.0, None]) is None
    assert median_min_max([]) is None


def test_hot_burst_spread_takes_each_ratio_within_a_repeat() -> None:
    spread = hot_burst_spread(_runs(), (9, 12), CANDIDATES)
    assert set(spread) == {"9"}  # no run at 12 slots: no row
    point = spread["9"]
    assert point["hot_burst_hot_p99_ttft_ms_lru"] == [600.0, 300.0, 900.0]
    # The timed-out request counts at the timeout (10 s) in its repeat's P99.
    assert point["hot_burst_hot_p99_ttft_ms_cost_aware"] == [100.0, 100.0, 10000.0]
    # Per repeat 3, 6, 0.09 (not the ratio of the medians, 6): median 3 [0.09-6].
    assert point["hot_burst_p99_ttft_lru_over_cost_aware"] == [3.0, 0.09, 6.0]
    assert point["hot_burst_hot_completed_ratio_cost_aware"] == [1.0, 0.75, 1.0]
    assert point["hot_burst_batch_p50_ttft_cost_aware_over_lru"] == [2.0, 2.0, 3.0]
    assert point["hot_burst_hot_p50_ttft_ms_lru"] == [600.0, 300.0, 900.0]
    assert point["hot_burst_l0_hit_ratio_lru"] == [0.75, 0.75, 0.75]


def test_the_report_shows_the_spread_per_slot_count_and_policy() -> None:
    metrics = {"hot_burst_repeats": hot_burst_spread(_runs(), (9,), CANDIDATES), "runs": {}}
    config = {"hot_burst_candidates": list(CANDIDATES), "trace_repeats": 3}
    page = serve_markdown({"name": "serve", "config": config, "seed": 0, "metrics": metrics},
                          "c.png", "h.png", "t.png")  # fmt: skip
    assert "median [min-max] over 3 repeats" in page
    assert "![hot-burst TTFT CDF per tenant](t.png)" in page
    cells = row_cells(page, "| slots | policy |", "| 9 | cost_aware |")
    assert cells["lru_over_policy_hot_p99"] == "3 [0.09-6]"
    assert cells["hot_p99_ms"] == "100 [100-10000]"
    assert cells["batch_p50_over_lru"] == "2 [2-3]"
    lru_row = next(line for line in page.splitlines() if line.startswith("| 9 | lru |"))
    assert "600 [300-900]" in lru_row


def test_tenant_ttft_cdf_keeps_the_hot_window_and_counts_failures(tmp_path: Path) -> None:
    series = tenant_ttft_ms(_runs(), (9, 12), CANDIDATES)
    assert list(series) == [9]
    assert list(series[9]) == ["prio", "batch"]
    hot = series[9]["prio"]
    assert list(hot) == ["lru", "lru_priority", "cost_aware"]
    assert len(hot["lru"]) == 12 and max(hot["lru"]) == 900.0  # the 9 s pre-sweep ones left out
    assert hot["cost_aware"][-1] == TIMEOUT_S * 1000  # the timed-out request, at the timeout
    assert series[9]["batch"]["cost_aware"] == [200.0] * 6 + [300.0] * 3
    png = tmp_path / "t.png"
    assert hot_burst_tenant_cdf_plot(_runs(), (9,), CANDIDATES, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not hot_burst_tenant_cdf_plot(_runs(), (16,), CANDIDATES, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def _polled(l0_hits: int) -> RunResult:
    """A repeat whose residency polls saw ``l0_hits`` of every 4 acquires from L0."""
    series = [(float(t), {"L0": l0_hits * t, "L3": (4 - l0_hits) * t}) for t in range(4)]
    return RunResult("r", (), ResidencyView(hit_series=series), TIMEOUT_S)


def test_the_hit_ratio_plot_draws_every_repeat(tmp_path: Path) -> None:
    """It drew the pooled run's hit series, the first repeat's alone."""
    repeats = [_polled(1), _polled(2), _polled(4)]
    pooled = RunResult("zipf@8/lru", (), repeats[0].residency, TIMEOUT_S, None, tuple(repeats))
    lines = hit_ratio_lines(pooled, window=1)
    assert lines == [([1.0, 2.0, 3.0], [ratio] * 3) for ratio in (0.25, 0.5, 1.0)]
    assert hit_ratio_lines(repeats[1], window=1) == [([1.0, 2.0, 3.0], [0.5] * 3)]
    png = tmp_path / "hit.png"
    hit_ratio_plot([pooled, repeats[1]], png, window=1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_runs_keep_each_repeat_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    @contextlib.contextmanager
    def serving(fleet: Any, data_dir: Path, options: ServerOptions) -> Iterator[str]:
        yield options.policy

    async def replay(url: str, *args: Any) -> tuple[list[RequestRecord], ResidencyView]:
        calls.append(url)
        ttft = len(calls) / 10  # each replay's records tell which call made them
        return [_record("prio", ttft)], ResidencyView(final={"misses": len(calls)})

    monkeypatch.setattr(runs_module, "serving", serving)
    monkeypatch.setattr(runs_module, "replay_over_http", replay)
    monkeypatch.setattr(runs_module, "drop_page_cache", lambda store: True)
    trace = Workload("zipf-longtail", 0, 10.0, (), ())
    group = [(f"t/{p}", trace, ServerOptions(p, 9, 1 << 20)) for p in ("lru", "cost_aware")]
    fleet = SimpleNamespace(store=Path("."), keys={}, admin_key="k")
    runs = trace_runs(TracePlan([group], 3, TIMEOUT_S), fleet, None, Path("."))  # type: ignore[arg-type]
    assert calls == ["lru", "cost_aware", "cost_aware", "lru", "lru", "cost_aware"]  # ABBA
    lru = runs[0]
    assert [rep.records[0].ttft_s for rep in lru.repeats] == [0.1, 0.4, 0.5]
    assert [rep.residency.final["misses"] for rep in lru.repeats] == [1, 4, 5]
    assert lru.records == tuple(r for rep in lru.repeats for r in rep.records)  # pooled too
    assert lru.residency.final["misses"] == 10
