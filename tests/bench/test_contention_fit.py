"""``sim calibrate-fleet``'s fit by simulation (``bench/sim/contention_fit.py``): the rounds
replayed in the simulator, and a curve rescaled until they reproduce measured throughputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loraplex.bench.sim.contention_fit import (
    TOLERANCE,
    RoundShape,
    fit_by_simulation,
    simulated_rate,
)
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel, load
from loraplex.sim.cpu import Contention

COUNTS = (1, 2, 4, 8)
SHAPE = RoundShape(
    (("t", "c0", 8, 80_000), ("t", "c1", 8, 80_000), ("t", "c2", 8, 80_000)), 4, 16, 8
)
CONFIG = SimConfig(replicas=3, max_loras=4, bytes_per_rank=10_000)


def _model() -> CostModel:
    return load(Path(__file__).resolve().parents[1] / "sim" / "cost_example.json")


def _rates(curve: Contention | None) -> dict[int, float]:
    model = replace(_model(), fleet_contention=curve)
    return {k: simulated_rate(model, CONFIG, SHAPE, k) for k in COUNTS}


def test_the_replayed_rounds_slow_down_with_the_curve_and_repeat_exactly() -> None:
    free = _rates(None)
    steep = _rates(Contention(COUNTS, (1.0, 2.0, 4.0, 8.0)))
    assert free[1] == steep[1]  # one client: nothing in flight beside it
    assert all(steep[k] < free[k] for k in COUNTS[1:])
    assert _rates(None) == free  # deterministic
    assert free[8] > free[1]  # the simulator's own batching lets more through


def test_the_fit_recovers_a_curve_from_the_rates_it_produced() -> None:
    """Rates simulated with a known curve, fitted from another start: the fitted curve
    reproduces them within the tolerance, and lands near the known one."""
    truth = Contention(COUNTS, (1.0, 1.4, 2.2, 3.6))
    measured = _rates(truth)
    start = Contention(COUNTS, (1.0, 2.0, 3.5, 6.0))
    fit = fit_by_simulation(_model(), CONFIG, SHAPE, measured, start)
    assert fit.worst_gap <= TOLERANCE
    assert fit.iterations >= 1
    assert fit.measured == measured
    assert fit.simulated_first == _rates(start)
    assert sorted(fit.simulated_ttft_s) == list(COUNTS)  # the fitted rounds' median TTFT
    assert fit.simulated_ttft_s[8] > fit.simulated_ttft_s[1]
    for got, want in zip(fit.contention.stretch, truth.stretch, strict=True):
        assert got == pytest.approx(want, rel=0.15)


def test_a_point_the_simulator_cannot_reach_stays_at_the_floor() -> None:
    """Measured faster than the simulator can run without any stretch: the curve floors at 1
    and the fit stops with the gap reported, not hidden."""
    free = _rates(None)
    measured = {k: rate * (1.0 if k == 1 else 1.5) for k, rate in free.items()}
    fit = fit_by_simulation(_model(), CONFIG, SHAPE, measured, Contention(COUNTS, (1, 2, 3, 4)))
    assert fit.contention.stretch == (1.0, 1.0, 1.0, 1.0)
    assert fit.worst_gap > TOLERANCE


def test_counts_that_do_not_match_the_curve_are_refused() -> None:
    with pytest.raises(ValueError, match="measured counts"):
        fit_by_simulation(
            _model(), CONFIG, SHAPE, {1: 10.0, 2: 15.0}, Contention(COUNTS, (1, 2, 3, 4))
        )
