from typing import Any

import pytest

from loraplex.bench.sim.compare import (
    check_outcome,
    compare_target,
    flat_errors,
    flat_spreads,
    hit_ratio_error_pp,
    median_outcome,
    real_spread,
    rel_error,
    trace_errors,
    worst,
)


def _outcome(
    l0: float | None = 0.6, p50: float = 100.0, p99: float = 400.0, rps: float = 5.0
) -> dict[str, Any]:
    l1 = None if l0 is None else 0.2
    l3 = None if l0 is None else round(1 - l0 - 0.2, 6)
    return {
        "hit_ratio": {"L0": l0, "L1": l1, "L2": None if l0 is None else 0.0, "L3": l3},
        "l0_loads": 10,
        "ttft_ms": {"p50": p50, "p99": p99},
        "throughput_requests_per_s": rps,
        "completed_ratio": 1.0,
    }


def test_errors_of_one_trace() -> None:
    real, sim = _outcome(0.60), _outcome(0.57, p50=110.0, p99=300.0, rps=5.5)
    errors = trace_errors(real, sim)
    # L0 off by 3 pp and L3 (the complement) by 3 pp too.
    assert errors["hit_ratio_abs_error_pp"] == pytest.approx(3.0)
    assert errors["ttft_p50_rel_error"] == pytest.approx(0.10)
    assert errors["ttft_p99_rel_error"] == pytest.approx(0.25)
    assert errors["throughput_rel_error"] == pytest.approx(0.10)


def test_undefined_sides_make_the_error_null_never_zero() -> None:
    assert rel_error(None, 1.0) is None
    assert rel_error(0.0, 1.0) is None
    assert rel_error(2.0, None) is None
    # A tier with no acquires on both sides is skipped; on one side only: undefined.
    assert hit_ratio_error_pp(_outcome(None), _outcome(None)) == 0.0
    assert hit_ratio_error_pp(_outcome(0.5), _outcome(None)) is None


def test_worst_is_the_max_over_traces_and_null_if_any_is_null() -> None:
    a = {
        "hit_ratio_abs_error_pp": 1.0,
        "ttft_p50_rel_error": 0.05,
        "ttft_p99_rel_error": 0.1,
        "throughput_rel_error": None,
    }
    b = {
        "hit_ratio_abs_error_pp": 2.5,
        "ttft_p50_rel_error": 0.01,
        "ttft_p99_rel_error": 0.3,
        "throughput_rel_error": 0.02,
    }
    out = worst([a, b])
    assert out == {
        "hit_ratio_abs_error_pp": 2.5,
        "ttft_p50_rel_error": 0.05,
        "ttft_p99_rel_error": 0.3,
        "throughput_rel_error": None,
    }
    assert all(v is None for v in worst([]).values())


def test_compare_target_pairs_traces_and_flattens() -> None:
    real = {"zipf-longtail": _outcome(0.6), "hot-burst": _outcome(0.8, p99=800.0)}
    sim = {"zipf-longtail": _outcome(0.61), "hot-burst": _outcome(0.75, p99=880.0)}
    single = compare_target(real, sim, "single")
    assert single["errors"]["hit_ratio_abs_error_pp"] == pytest.approx(5.0)
    assert single["errors"]["ttft_p99_rel_error"] == pytest.approx(0.1)
    assert single["traces"]["hot-burst"]["l0_loads_rel_error"] == 0.0
    flat = flat_errors({"single": single})
    assert flat["ttft_p99_rel_error_single"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="differ"):
        compare_target(real, {"zipf-longtail": _outcome()}, "fleet")


def test_an_outcome_missing_a_key_is_refused_by_name() -> None:
    bad = _outcome()
    del bad["throughput_requests_per_s"]
    with pytest.raises(ValueError, match="throughput_requests_per_s"):
        check_outcome(bad, "fleet/hot-burst (sim)")
    worse = _outcome()
    del worse["hit_ratio"]["L2"]
    with pytest.raises(ValueError, match="L2"):
        check_outcome(worse, "x")


def test_repeated_real_runs_compare_by_their_median() -> None:
    runs = [_outcome(0.6, p50=100.0), _outcome(0.5, p50=300.0), _outcome(0.7, p50=120.0)]
    runs[0]["decisions"] = {"gpu_hit": 4, "placement": 2}
    runs[1]["decisions"] = {"gpu_hit": 6}
    runs[2]["decisions"] = {"gpu_hit": 5, "placement": 1}
    med = median_outcome(runs)
    assert med["ttft_ms"]["p50"] == 120.0  # not the mean (173.3): one slow run does not lead
    assert med["hit_ratio"]["L0"] == pytest.approx(0.6)
    assert med["decisions"] == {"gpu_hit": 5, "placement": 1}  # a missing reason counts 0
    assert [r["ttft_ms"]["p50"] for r in med["runs"]] == [100.0, 300.0, 120.0]
    check_outcome(med, "median")
    assert median_outcome(runs[:1]) == runs[0]  # one run: as it is, no "runs"
    undefined = median_outcome([_outcome(None), _outcome(0.6)])
    assert undefined["hit_ratio"]["L0"] is None  # undefined in one run: not claimed
    with pytest.raises(ValueError, match="at least one run"):
        median_outcome([])


def test_the_real_spread_is_the_real_side_against_itself() -> None:
    runs = {
        "zipf-longtail": [_outcome(0.6, p50=100.0), _outcome(0.6, p50=125.0)],
        "hot-burst": [_outcome(0.8, p99=400.0), _outcome(0.77, p99=500.0)],
    }
    spread = real_spread(runs)
    # each run as the real side of the other: 25/100 is the larger P50 error of the pair
    assert spread["ttft_p50_rel_error"] == pytest.approx(0.25)
    assert spread["ttft_p99_rel_error"] == pytest.approx(0.25)
    assert spread["hit_ratio_abs_error_pp"] == pytest.approx(3.0)
    assert spread["throughput_rel_error"] == 0.0
    one = real_spread({"zipf-longtail": runs["zipf-longtail"][:1]})
    assert all(v is None for v in one.values())  # not measured: never 0
    flat = flat_spreads({"single": spread})
    assert flat["ttft_p50_rel_error_single_real_spread"] == pytest.approx(0.25)
