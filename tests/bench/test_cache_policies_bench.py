"""``bench residency``: the policy replays' JSON shape, pooling, undefined ratios and the drift
recovery measure (behaviour on tiny traces, not timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.bench.cache.policies import (
    BELADY,
    POINTS,
    PolicyBenchConfig,
    drift_recovery_share,
    headline,
    run_policy_bench,
)
from loraplex.bench.cache.policies_report import policies_markdown, policies_plots
from loraplex.bench.workloads import HOT_BURST_WINDOW, ScenarioParams, generate
from loraplex.cli import app


def test_a_tiny_run_reports_every_trace_policy_and_headline(tmp_path: Path) -> None:
    config = PolicyBenchConfig(
        policies=("lru", "admit_gdsf", "tiered_gdsf", "tiered_gdsf_fetch"),
        repeats=2,
        duration_s=30.0,
    )
    result = run_policy_bench(config)
    assert set(result["traces"]) == {label for label, _, _ in POINTS}
    for policies in result["traces"].values():
        assert set(policies) == {"lru", "admit_gdsf", "tiered_gdsf", "tiered_gdsf_fetch", BELADY}
        floors = policies.pop(BELADY)
        for cells in policies.values():
            # No replayed policy has fewer reloads than the floor of its tier (L0: Belady; L1,
            # L2: the LP) or of all tiers in any seed, so neither in the median, min or max.
            for metric in ("l0", "l1", "l2"):
                floor, reloads = (
                    floors[f"reloads_per_1k_{metric}"],
                    cells[f"reloads_per_1k_{metric}"],
                )
                assert floor is not None and all(
                    f <= r for f, r in zip(floor, reloads, strict=True)
                )
            total = zip(floors["reloads_per_1k"], cells["reloads_per_1k"], strict=True)
            assert all(f <= r for f, r in total)
            hit = cells["hit_l0"]
            assert hit is not None and hit[1] <= hit[0] <= hit[2]  # median within [min, max]
            assert cells["failed"] == [0.0, 0.0, 0.0]
            assert cells["hit_l0"][0] <= cells["hit_l0_l1"][0] <= cells["hit_l0_l2"][0]
    zipf = result["traces"]["zipf-longtail"]
    assert result["metrics"]["zipf_longtail_hit_l0_admit_gdsf_pp_over_lru"] == pytest.approx(
        100 * (zipf["admit_gdsf"]["hit_l0"][0] - zipf["lru"]["hit_l0"][0]), abs=0.01
    )
    # Every tenant's wait against lru's, per new policy (no tenant may pay for the gain).
    drift = result["traces"]["drift"]
    assert result["metrics"]["drift_p99_wait_tenant_tiered_gdsf_fetch_over_lru"] == pytest.approx(
        drift["tiered_gdsf_fetch"]["wait_p99_s_tenant"][0] / drift["lru"]["wait_p99_s_tenant"][0],
        abs=1e-4,
    )
    storm = [k for k in result["metrics"] if k.startswith("cold_storm_p50_wait_")]
    assert {k.split("_wait_")[1].split("_", 1)[0] for k in storm} == {
        "steady-a",
        "steady-b",
        "storm",
    }
    assert "drift_recovery_share" in result["traces"]["drift"]["lru"]
    assert set(result["wait_cdfs"]) == {"prio", "batch"}
    # Hot-burst's waits count from the sweep on (as bench serve reads the hot tenant's TTFT).
    trace = generate("hot-burst", 0, ScenarioParams(duration_s=30.0, rate=config.rate))
    from_sweep = [r for r in trace.requests if r.t_s >= HOT_BURST_WINDOW[0] * 30.0]
    assert len(result["wait_cdfs"]["prio"]["lru"]) == sum(r.tenant == "prio" for r in from_sweep)
    assert len(from_sweep) < len(trace.requests)
    json.dumps(result)
    policies_plots(result, tmp_path / "hit.png", tmp_path / "cdf.png")
    assert (tmp_path / "hit.png").stat().st_size > 0 and (tmp_path / "cdf.png").stat().st_size > 0
    assert "zipf-longtail" in policies_markdown(result, ("hit.png", "cdf.png"))


def test_without_tier_floors_only_l0_is_bounded() -> None:
    config = PolicyBenchConfig(
        policies=("lru",), repeats=1, duration_s=30.0, traces=("zipf-longtail",), tier_floors=False
    )
    result = run_policy_bench(config)
    assert set(result["traces"]["zipf-longtail"][BELADY]) == {"reloads_per_1k_l0"}
    assert result["metrics"]["zipf_longtail_l1_reloads_lru_over_floor"] is None
    assert result["metrics"]["zipf_longtail_reloads_lru_over_floor"] is None


def test_a_zero_denominator_is_null_never_zero() -> None:
    cell = {"wait_p99_s_prio": [0.0, 0.0, 0.0], "wait_p50_s_batch": [0.02, 0.02, 0.02]}
    cell |= {"reloads_per_1k": [0.0, 0.0, 0.0]}
    summary = {label: {"lru": cell, "admit_gdsf": cell} for label, _, _ in POINTS}
    metrics = headline(summary, ("lru", "admit_gdsf"))
    assert metrics["hot_burst_s9_hot_p99_wait_lru_over_admit_gdsf"] is None
    assert metrics["hot_burst_s9_reloads_lru_over_admit_gdsf"] is None
    assert metrics["hot_burst_s9_batch_p50_wait_admit_gdsf_over_lru"] == 1.0


def test_drift_recovery_is_read_from_the_rotation_aligned_mean() -> None:
    # 5 phases x 20 buckets: each rotation dips to 0.1 for 3 buckets, steady 0.5 after.
    phase = [0.1, 0.1, 0.1] + [0.5] * 17
    timeline = [(float(i), h) for i, h in enumerate(phase * 5)]
    assert drift_recovery_share(timeline, 100.0) == pytest.approx(4 / 20)
    late = [0.1] * 10 + [0.9] * 10  # back only in the second half: 11 buckets
    assert drift_recovery_share([(float(i), h) for i, h in enumerate(late * 5)], 100.0) == 0.55
    gap: list[tuple[float, float | None]] = [(float(i), 0.5) for i in range(100)]
    gap[30] = (30.0, None)
    assert drift_recovery_share(gap, 100.0) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("policies", ("nope",)),
        ("repeats", 0),
        ("duration_s", 0.0),
        ("tpot_s", -1.0),
        ("tenant_tier_share", 0.0),
        ("tenant_tier_share", 1.5),
    ],
)
def test_config_refuses_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        PolicyBenchConfig(**{field: value})  # type: ignore[arg-type]


def test_cli_refuses_an_unknown_policy_by_name() -> None:
    out = CliRunner().invoke(app, ["bench", "residency", "--policies", "lru,bogus"])
    assert out.exit_code == 2 and "policies" in out.output


def _hot_burst_12(**share: object) -> dict[str, list[float]]:
    config = PolicyBenchConfig(
        policies=("lru_priority",),
        repeats=1,
        duration_s=30.0,
        rate=16.98,
        tpot_s=0.04,
        traces=("hot-burst@12",),
        tier_floors=False,
        **share,  # type: ignore[arg-type]
    )
    return run_policy_bench(config)["traces"]["hot-burst@12"]["lru_priority"]


def test_the_replay_keeps_the_servers_tenant_share_and_its_priority_rule() -> None:
    """hot-burst at 12 slots (the bench serve shape): at the server's share of 0.5 the batch
    tenant's sweep takes back 6 of the slots the 8 hot adapters need, whatever the policy,
    and the hot tenant's P99 wait grows about a hundredfold; under ``tier_share_by_priority``
    the share no longer holds the hot set down (seed 0: 0.434 s, 0.004 s without a share)."""
    plain = _hot_burst_12()
    shared = _hot_burst_12(tenant_tier_share=0.5)
    ranked = _hot_burst_12(tenant_tier_share=0.5, tier_share_by_priority=True)
    assert shared["wait_p99_s_prio"][0] > 10 * plain["wait_p99_s_prio"][0]
    assert ranked["wait_p99_s_prio"][0] < shared["wait_p99_s_prio"][0] / 10
    assert ranked["hit_l0"][0] > shared["hit_l0"][0]
