"""``bench serve --tier-share-by-priority both`` on synthetic records (no server): every
hot-burst cell runs with the rule off and on in ABBA order over the repeats, the on / off ratios
come from the right arms within one ABBA round, and an undefined ratio is null, never 0."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from report_rows import row_cells
from typer.testing import CliRunner

from loraplex.bench.serve import bench as bench_module
from loraplex.bench.serve import runs as runs_module
from loraplex.bench.serve.bench import run_serve_bench
from loraplex.bench.serve.config import ServeBenchConfig
from loraplex.bench.serve.driver import RequestRecord, ResidencyView
from loraplex.bench.serve.fleet import ServerOptions
from loraplex.bench.serve.report import serve_markdown
from loraplex.bench.serve.runs import TracePlan, comparisons, trace_runs
from loraplex.bench.serve.share_arms import arm_run, arm_runs, share_arm_metrics, with_arms
from loraplex.bench.serve.summary import RunResult, hot_burst_run
from loraplex.bench.serve.throughput import ThroughputResult
from loraplex.bench.workloads import Workload
from loraplex.cli import app
from loraplex.demo.assets import DemoAssets

TIMEOUT_S = 10.0
BURST_S = 3.0
CANDIDATES = ("admit_gdsf",)
BASELINES = ("lru",)


def _record(tenant: str, ttft_s: float | None, t_s: float = 5.0) -> RequestRecord:
    status, error = (200, None) if ttft_s is not None else (0, "timeout")
    return RequestRecord(t_s, tenant, "a", "L0", status, ttft_s, None, 4, "r1", error)


def _repeat(hot_s: float, batch_s: list[float]) -> RunResult:
    """One repeat: four hot requests from the sweep on at ``hot_s``, the batch ones given."""
    records = [_record("prio", hot_s)] * 4 + [_record("batch", s) for s in batch_s]
    return RunResult("r", tuple(records), ResidencyView(), TIMEOUT_S, BURST_S)


def _pooled(name: str, repeats: list[RunResult]) -> RunResult:
    records = tuple(r for rep in repeats for r in rep.records)
    return RunResult(name, records, ResidencyView(), TIMEOUT_S, BURST_S, tuple(repeats))


def _fake_servers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, bool, int]]:
    """Servers that serve nothing: each run's (slots, policy, rule, trace id) in run order;
    its records answer the hot tenant in 0.1 s x the run's place in the order."""
    calls: list[tuple[int, str, bool, int]] = []
    current: list[ServerOptions] = []

    @contextlib.contextmanager
    def serving(fleet: Any, data_dir: Path, options: ServerOptions) -> Iterator[str]:
        current[:] = [options]
        yield "url"

    async def replay(url: str, requests: Any, *args: Any) -> Any:
        options = current[0]
        calls.append((options.max_loras, options.policy, options.tier_share_by_priority,
                      id(requests)))  # fmt: skip
        records = [_record("prio", len(calls) / 10, 9.0), _record("batch", 1.0, 9.0)]
        return records, ResidencyView()

    monkeypatch.setattr(runs_module, "serving", serving)
    monkeypatch.setattr(runs_module, "replay_over_http", replay)
    monkeypatch.setattr(runs_module, "drop_page_cache", lambda store: True)
    return calls


def _runs() -> list[RunResult]:
    """At 9 slots: lru's hot P99 0.4 s off in every repeat, 0.1 / 0.2 / 0.4 s on, its batch P50
    1 s off and 2 s on; admit_gdsf's off arm has no batch request in its second repeat."""
    lru_off = [_repeat(0.4, [1.0]) for _ in range(3)]
    lru_on = [_repeat(s, [2.0]) for s in (0.1, 0.2, 0.4)]
    gdsf_off = [_repeat(0.2, [1.0]), _repeat(0.2, []), _repeat(0.2, [1.0])]
    gdsf_on = [_repeat(0.1, [3.0]) for _ in range(3)]
    sides = {("lru", "off"): lru_off, ("lru", "on"): lru_on}
    sides |= {("admit_gdsf", "off"): gdsf_off, ("admit_gdsf", "on"): gdsf_on}
    return [_pooled(arm_run(hot_burst_run(9, p), arm), reps) for (p, arm), reps in sides.items()]


def test_every_cell_runs_both_arms_in_abba_order(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = _fake_servers(monkeypatch)
    burst = Workload("hot-burst", 0, 10.0, (), ())
    groups = comparisons(
        {"hot-burst": burst}, (9, 12), 16, lambda p, n: ServerOptions(p, n, 1 << 20),
        CANDIDATES, baselines=BASELINES,
    )  # fmt: skip
    fleet = SimpleNamespace(store=Path("."), keys={}, admin_key="k")
    plan = TracePlan([with_arms(g) for g in groups], 3, TIMEOUT_S)
    runs = trace_runs(plan, fleet, None, Path("."))  # type: ignore[arg-type]
    calls = [call[:3] for call in recorded]
    assert len(calls) == 2 * 2 * 2 * 3  # slot counts x policies x arms x repeats
    for slots in (9, 12):
        for policy in ("lru", "admit_gdsf"):
            arms = [on for n, p, on in calls if (n, p) == (slots, policy)]
            first = slots == 12  # the second group starts on the other side, as before
            assert arms == [first, not first, not first, first, first, not first], (slots, policy)
    # The two arms of a cell run next to each other: the same trace a run apart.
    assert calls[:4] == [(9, "lru", False), (9, "lru", True),
                         (9, "admit_gdsf", False), (9, "admit_gdsf", True)]  # fmt: skip
    names = [run.name for run in runs]
    assert names[:2] == ["hot-burst@9/lru/by-priority-off", "hot-burst@9/lru/by-priority-on"]
    on = arm_runs(runs, "on")
    assert [run.name for run in on] == [hot_burst_run(n, p) for n in (9, 12)
                                        for p in ("lru", "admit_gdsf")]  # fmt: skip
    # Repeat i of the on arm is the call of its ABBA round: 2nd, 6th (on first), 10th.
    lru_on = [rep.records[0].ttft_s for rep in on[0].repeats]
    assert lru_on == [0.2, 0.7, 1.0]


def test_the_bench_runs_both_arms_on_one_trace_at_one_rate(
    monkeypatch: pytest.MonkeyPatch, demo_assets: DemoAssets, tmp_path: Path
) -> None:
    calls = _fake_servers(monkeypatch)
    measured: list[object] = []

    def measure(*args: Any) -> ThroughputResult:
        measured.append(args)
        return ThroughputResult((1.0,), (1.0,), 0, capacity_rps=(10.0,))

    fleet = SimpleNamespace(store=tmp_path, keys={}, admin_key="k")
    monkeypatch.setattr(bench_module, "prepare_fleet", lambda *args: fleet)
    monkeypatch.setattr(bench_module, "measure_throughput", measure)
    monkeypatch.setattr(bench_module, "drop_page_cache", lambda store: True)
    config = ServeBenchConfig(
        duration_s=10.0, scenarios=("hot-burst",), hot_burst_slots=(9,),
        hot_burst_candidates=CANDIDATES, hot_burst_baselines=BASELINES, trace_repeats=2,
        tier_share_by_priority="both", asset_dir=demo_assets.root.parent,
    )  # fmt: skip
    metrics = run_serve_bench(config)["metrics"]
    assert len(measured) == 1 and metrics["trace_rate"] == 6.0  # one capacity, both arms
    assert len({trace for *_, trace in calls}) == 1  # one trace
    assert [(p, on) for _, p, on, _ in calls] == [
        ("lru", False), ("lru", True), ("admit_gdsf", False), ("admit_gdsf", True),
        ("admit_gdsf", True), ("admit_gdsf", False), ("lru", True), ("lru", False),
    ]  # fmt: skip
    # lru's hot P99 per repeat: on 0.2 / 0.7 s over off 0.1 / 0.8 s.
    effect = metrics["tier_share_by_priority_on_over_off"]["9"]["lru"]
    assert effect["hot_p99_ttft_on_over_off"] == [1.4375, 0.875, 2.0]
    assert set(metrics["tier_share_by_priority_arms"]) == {"off", "on"}
    # No plain hot-burst run: its flat keys would be every arm's null.
    assert "hot_burst_p99_ttft_lru_over_admit_gdsf" not in metrics
    assert "hot_burst_9_lru_by_priority_on_l0_hit_ratio" in metrics


def test_on_over_off_is_taken_within_a_repeat_from_the_right_arms() -> None:
    metrics = share_arm_metrics(_runs(), (9,), CANDIDATES, BASELINES)
    lru = metrics["tier_share_by_priority_on_over_off"]["9"]["lru"]
    # Per repeat on / off 0.25, 0.5, 1.0 (reversed arms would give 4, 2, 1).
    assert lru["hot_p99_ttft_on_over_off"] == [0.5, 0.25, 1.0]
    assert lru["batch_p50_ttft_on_over_off"] == [2.0, 2.0, 2.0]
    assert lru["hot_p99_ttft_on_over_off_pooled"] == 1.0  # both arms pooled: P99 0.4 s
    assert lru["batch_p50_ttft_on_over_off_pooled"] == 2.0
    arms = metrics["tier_share_by_priority_arms"]
    assert arms["off"]["hot_burst_sweep"]["9"]["hot_burst_hot_p99_ttft_ms_lru"] == 400.0
    assert arms["on"]["hot_burst_repeats"]["9"]["hot_burst_hot_p99_ttft_ms_lru"] == [
        200.0, 100.0, 400.0,
    ]  # fmt: skip
    # Each arm has a plain run's figures: the candidate against the baselines run, only those.
    assert arms["on"]["hot_burst_p99_ttft_lru_over_admit_gdsf"] == 4.0
    assert not any("lru_priority" in key for key in arms["on"])


def test_an_undefined_ratio_is_null_never_zero() -> None:
    gdsf = share_arm_metrics(_runs(), (9, 12), CANDIDATES, BASELINES)[
        "tier_share_by_priority_on_over_off"
    ]
    # The off arm's second repeat had no batch request: that repeat's ratio is undefined, so
    # the spread is too (a repeat must not vanish); the pooled repeats still have one.
    cell = gdsf["9"]["admit_gdsf"]
    assert cell["batch_p50_ttft_on_over_off"] is None
    assert cell["batch_p50_ttft_on_over_off_pooled"] == 3.0
    assert cell["hot_p99_ttft_on_over_off"] == [0.5, 0.5, 0.5]
    # No run at 12 slots: every figure null.
    assert set(gdsf["12"]["lru"].values()) == {None}
    zero = [_pooled(arm_run(hot_burst_run(9, "lru"), arm), [_repeat(s, [1.0])])
            for arm, s in (("off", 0.0), ("on", 0.1))]  # fmt: skip
    effect = share_arm_metrics(zero, (9,), (), BASELINES)["tier_share_by_priority_on_over_off"]
    assert effect["9"]["lru"]["hot_p99_ttft_on_over_off"] is None  # 0.1 / 0: not 0, not inf
    assert effect["9"]["lru"]["hot_p99_ttft_on_over_off_pooled"] is None


def test_the_report_shows_the_rule_per_cell_and_each_arm() -> None:
    metrics = {**share_arm_metrics(_runs(), (9,), CANDIDATES, BASELINES), "runs": {}}
    config = {"hot_burst_candidates": list(CANDIDATES), "hot_burst_baselines": list(BASELINES),
              "trace_repeats": 3}  # fmt: skip
    page = serve_markdown({"name": "serve", "config": config, "seed": 0, "metrics": metrics},
                          "c.png", "h.png", None, {"on": "t-on.png"})  # fmt: skip
    cells = row_cells(page, "| slots | policy | hot_p99_ttft", "| 9 | lru | 0.5")
    assert cells["hot_p99_ttft_on_over_off"] == "0.5 [0.25-1]"
    assert cells["batch_p50_ttft_on_over_off_pooled"] == "2.000"
    assert "## Hot-burst per repeat (tier_share_by_priority on)" in page
    assert "## Hot-burst per repeat (tier_share_by_priority off)" in page
    assert "(t-on.png)" in page
    assert "## Hot-burst capacity sweep" not in page  # no plain run: no empty table


def test_the_setting_is_checked_and_both_is_hot_burst_only() -> None:
    assert ServeBenchConfig(tier_share_by_priority="both", scenarios=("hot-burst",))
    with pytest.raises(ValueError, match="tier_share_by_priority"):
        ServeBenchConfig(tier_share_by_priority="yes")
    with pytest.raises(ValueError, match=r"tier_share_by_priority 'both'.*zipf-longtail"):
        ServeBenchConfig(tier_share_by_priority="both", scenarios=("hot-burst", "zipf-longtail"))
    with pytest.raises(ValueError, match="tier_share_by_priority 'both'"):
        ServeBenchConfig(tier_share_by_priority="both", scenarios=("cold-storm",))
    with pytest.raises(ValueError, match="hot_burst_baselines"):
        ServeBenchConfig(hot_burst_baselines=("cost_aware",))
    with pytest.raises(ValueError, match="hot_burst_baselines"):
        ServeBenchConfig(hot_burst_baselines=())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tier-share-by-priority"], "requires an argument"),  # the bare flag of before
        (["--tier-share-by-priority", "--json"], "now --tier-share-by-priority on"),
        (["--tier-share-by-priority", "both", "--scenarios", "zipf-longtail"], "'both'"),
        (["--hot-burst-baselines", "lru,cost_aware"], "hot_burst_baselines"),
    ],
)
def test_the_cli_refuses_what_it_cannot_run(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["bench", "serve", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
