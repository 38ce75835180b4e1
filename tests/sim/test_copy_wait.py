"""The engine's wait for copies from host memory (``engine.lease_desk.MAX_COPY_WAIT_S``),
mirrored by the simulator's lease desk (``sim/lease_desk.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sim_inputs import cost

from loraplex.engine.lease_desk import MAX_COPY_WAIT_S
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import Link
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

_TRACE = [TraceRecord(t, "t", name, 16, 4) for t, name in ((0.0, "a"), (1.0, "b"), (2.0, "a"))]


def _third(copy_s: float) -> Outcome:
    """a (cold), b (cold, takes a's only slot), a again from host memory with a copy of
    ``copy_s``; the third request's outcome."""
    model = cost()
    links = {**model.links, "L1_to_L0": Link(copy_s, 1e15)}
    kept: list[Outcome] = []
    simulate(_TRACE, SimConfig(max_loras=1), replace(model, links=links), keep_outcomes=kept)
    return kept[2]


def test_a_copy_that_fits_runs_in_the_step_that_asked_and_delays_it_by_the_copy() -> None:
    fast, slower = _third(0.002), _third(0.012)
    assert fast.tier == slower.tier == "L1"
    assert fast.first_token_s is not None and slower.first_token_s is not None
    # the step waited the copy (10 ms more), no idle poll or later step in between
    assert slower.first_token_s - fast.first_token_s == pytest.approx(0.010, abs=1e-6)


def test_a_copy_that_does_not_fit_waits_as_before() -> None:
    """A 50 ms copy: the step plans without it after MAX_COPY_WAIT_S; the request runs at a
    later step, after its copy came."""
    late = _third(0.050)
    fits = _third(MAX_COPY_WAIT_S / 2)
    assert late.first_token_s is not None and fits.first_token_s is not None
    assert late.first_token_s - fits.first_token_s >= 0.050 - MAX_COPY_WAIT_S / 2


def _pair(copy_s: float) -> list[Outcome]:
    """a, b cold; c, d take both slots; a and b again at once, from host memory, each with a
    copy of ``copy_s``: the last two requests' outcomes."""
    model = cost()
    links = {**model.links, "L1_to_L0": Link(copy_s, 1e15)}
    trace = [TraceRecord(float(t), "t", n, 16, 4) for t, n in enumerate("abcd")]
    trace += [TraceRecord(4.0, "t", "a", 16, 4), TraceRecord(4.0, "t", "b", 16, 4)]
    kept: list[Outcome] = []
    simulate(trace, SimConfig(max_loras=2), replace(model, links=links), keep_outcomes=kept)
    return kept[4:]


def test_the_copies_of_a_step_are_bounded_together_as_the_slot_lock_runs_them() -> None:
    """Two 8 ms copies fit the 20 ms together: both run in the step that asked, which starts
    16 ms later. Two 12 ms copies (overlapping in the simulated loads) do not: the first runs,
    the step starts at the bound, the second waits for a later step."""
    both = _pair(0.008)
    assert [o.tier for o in both] == ["L1", "L1"]
    assert both[0].first_token_s == both[1].first_token_s
    one = _pair(0.012)
    assert [o.tier for o in one] == ["L1", "L1"]
    first, second = (o.first_token_s for o in one)
    lone = _third(0.002).first_token_s  # one such request's step, started after its 2 ms copy
    assert first is not None and second is not None and lone is not None
    assert first - 4.0 == pytest.approx(MAX_COPY_WAIT_S + lone - 2.002, abs=1e-6)
    assert second > first
    assert both[0].first_token_s is not None and both[0].first_token_s > 4.016


def _base_first_token(with_copy: bool) -> float:
    """One load at a time: c's cold load runs when a (in host memory) asks for its copy, so that
    copy is queued behind it; a base-model request arrives in the same step. Its first token."""
    trace = [TraceRecord(0.0, "t", "a", 16, 4), TraceRecord(1.0, "t", "b", 16, 4)]
    trace += [TraceRecord(2.0, "t", "c", 16, 4)]
    trace += [TraceRecord(2.001, "t", "a", 16, 4)] if with_copy else []
    trace += [TraceRecord(2.001, "t", None, 16, 4)]
    kept: list[Outcome] = []
    config = SimConfig(max_loras=1, max_concurrent_loads=1)
    simulate(trace, config, cost(), keep_outcomes=kept)
    base = kept[-1]
    assert base.first_token_s is not None
    return base.first_token_s


def test_a_copy_queued_behind_another_load_is_not_waited_for() -> None:
    """Only a copy under way is waited for (``TieredAdapterCache.is_moving``): a queued one may
    take any time, and waiting for it would stall every request of the step by the bound."""
    assert _base_first_token(True) - _base_first_token(False) < MAX_COPY_WAIT_S / 2
