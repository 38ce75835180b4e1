"""Real vs simulated, side by side: the figures both sides report and the errors between them.

Both sides describe one (target, trace) run with the same keys (``OUTCOME_KEYS``), those of the
simulator's result metrics (``sim/result.py``), which are named as ``bench serve`` / ``bench
fleet`` name theirs:

    hit_ratio                  {"L0", "L1", "L2", "L3"} -> share of adapter acquires served from
                               that tier (L3: misses to the store); None when there was none
    l0_loads                   fills of GPU slots during the trace (the cold loads)
    ttft_ms                    {"p50", "p99", ...}: TTFT over every request, failures at timeout
    throughput_requests_per_s  completed requests / makespan (first arrival to last end)
    completed_ratio            completed / requests
    decisions                  routing decisions by reason (fleet only; optional)

Errors (issue 30's "done when"), per target (``single``, ``fleet``), each the max over traces:
``hit_ratio_abs_error_pp`` (max also over tiers, percentage points), ``ttft_p50_rel_error``,
``ttft_p99_rel_error``, ``throughput_rel_error`` (|sim - real| / real). An error with an
undefined side (None, or a real value of 0 under a relative error) is None, never 0: it cannot
be claimed small.

Repeated real runs of one trace (``bench sim --repeats``) are compared by their median
(``median_outcome``), and the same four errors between the runs themselves (``real_spread``:
each run against each other, max over pairs and traces) say how far two real runs of one trace
fall apart: a simulator error below that spread is not evidence of fidelity.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

TIERS = ("L0", "L1", "L2", "L3")
OUTCOME_KEYS = (
    "hit_ratio",
    "l0_loads",
    "ttft_ms",
    "throughput_requests_per_s",
    "completed_ratio",
)
THROUGHPUT = "throughput_requests_per_s"
ERROR_KEYS = (
    "hit_ratio_abs_error_pp",
    "ttft_p50_rel_error",
    "ttft_p99_rel_error",
    "throughput_rel_error",
)
# The bounds, shown beside the errors (never used to pass or fail a run).
TARGETS = {
    "hit_ratio_abs_error_pp": 3.0,
    "ttft_p50_rel_error": 0.10,
    "ttft_p99_rel_error": 0.20,
    "throughput_rel_error": 0.10,
}

Outcome = Mapping[str, Any]


def check_outcome(outcome: Outcome, where: str) -> None:
    """Refuses an outcome missing a key both sides must report, naming it."""
    missing = [k for k in OUTCOME_KEYS if k not in outcome]
    if missing:
        raise ValueError(f"{where}: outcome lacks {missing}; expected keys {list(OUTCOME_KEYS)}")
    for name, keys in (("hit_ratio", TIERS), ("ttft_ms", ("p50", "p99"))):
        lacking = [k for k in keys if k not in outcome[name]]
        if lacking:
            raise ValueError(f"{where}: {name} lacks {lacking}")


def rel_error(real: float | None, sim: float | None) -> float | None:
    """|sim - real| / real; None when a side is unknown or real is not > 0."""
    if real is None or sim is None or not real > 0:
        return None
    return abs(sim - real) / real


def hit_ratio_error_pp(real: Outcome, sim: Outcome) -> float | None:
    """Largest |sim - real| hit ratio over the tiers, in percentage points. A tier undefined on
    both sides (no acquires anywhere) is skipped; on one side only, the error is None."""
    worst = 0.0
    for tier in TIERS:
        a, b = real["hit_ratio"][tier], sim["hit_ratio"][tier]
        if a is None and b is None:
            continue
        if a is None or b is None:
            return None
        worst = max(worst, abs(float(a) - float(b)) * 100.0)
    return worst


def trace_errors(real: Outcome, sim: Outcome) -> dict[str, float | None]:
    """One trace's four errors."""
    return {
        "hit_ratio_abs_error_pp": hit_ratio_error_pp(real, sim),
        "ttft_p50_rel_error": rel_error(real["ttft_ms"]["p50"], sim["ttft_ms"]["p50"]),
        "ttft_p99_rel_error": rel_error(real["ttft_ms"]["p99"], sim["ttft_ms"]["p99"]),
        "throughput_rel_error": rel_error(real[THROUGHPUT], sim[THROUGHPUT]),
    }


def worst(per_trace: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Each error's max over the traces; None if any trace's is None (or there is no trace)."""
    out: dict[str, float | None] = {}
    for key in ERROR_KEYS:
        values = [t[key] for t in per_trace]
        if not values or any(v is None for v in values):
            out[key] = None
        else:
            out[key] = round(max(float(v) for v in values if v is not None), 4)
    return out


def compare_target(
    real: Mapping[str, Outcome], sim: Mapping[str, Outcome], target: str
) -> dict[str, Any]:
    """One target's traces side by side: per trace both outcomes and the errors, then the worst
    of each error. Both sides must have run the same traces."""
    if set(real) != set(sim):
        raise ValueError(
            f"{target}: real traces {sorted(real)} differ from simulated {sorted(sim)}"
        )
    traces: dict[str, Any] = {}
    for name in sorted(real):
        check_outcome(real[name], f"{target}/{name} (real)")
        check_outcome(sim[name], f"{target}/{name} (sim)")
        traces[name] = {
            "real": dict(real[name]),
            "sim": dict(sim[name]),
            "errors": trace_errors(real[name], sim[name]),
            "l0_loads_rel_error": rel_error(real[name]["l0_loads"], sim[name]["l0_loads"]),
        }
    return {"errors": worst([t["errors"] for t in traces.values()]), "traces": traces}


def flat_errors(by_target: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """``{error}_{target}`` keys for the JSON line, e.g. ``ttft_p99_rel_error_fleet``."""
    return {
        f"{key}_{target}": result["errors"][key]
        for target, result in by_target.items()
        for key in ERROR_KEYS
    }


def _median(values: Sequence[Any], missing_is_zero: bool = False) -> Any:
    """Numbers: their median (None if any is None); objects: key by key; else the first."""
    if all(isinstance(v, dict) for v in values):
        keys = dict.fromkeys(k for v in values for k in v)
        if missing_is_zero:  # counts by reason: a reason a run never gave is 0 there
            return {k: _median([v.get(k, 0) for v in values]) for k in keys}
        return {k: _median([v[k] for v in values]) for k in keys if all(k in v for v in values)}
    if any(v is None for v in values):
        return None
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return statistics.median(values)
    return values[0]


def median_outcome(runs: Sequence[Outcome]) -> dict[str, Any]:
    """Repeated real runs of one trace as one outcome: every figure the median over ``runs``
    (a tier's hit ratio None if it is in any run; routing decisions a reason at a time), each
    run kept under ``runs``. One run is returned as it is."""
    if not runs:
        raise ValueError("median_outcome needs at least one run")
    if len(runs) == 1:
        return dict(runs[0])
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    out = {k: _median([r[k] for r in runs], missing_is_zero=k == "decisions") for k in keys}
    out["runs"] = [dict(r) for r in runs]
    return out


def real_spread(runs_by_trace: Mapping[str, Sequence[Outcome]]) -> dict[str, float | None]:
    """The four errors of the real side against itself: for each trace every run taken as the
    real side of every other, max over those pairs and over traces. None (never 0) where a trace
    has fewer than two runs: no spread was measured."""
    pairs = []
    for runs in runs_by_trace.values():
        if len(runs) < 2:
            return dict.fromkeys(ERROR_KEYS)
        pairs += [trace_errors(a, b) for a, b in itertools.permutations(runs, 2)]
    return worst(pairs)


def flat_spreads(spreads: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    """``{error}_{target}_real_spread`` keys for the JSON line."""
    return {
        f"{key}_{target}_real_spread": errors[key]
        for target, errors in spreads.items()
        for key in ERROR_KEYS
    }
