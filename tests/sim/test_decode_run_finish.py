"""A decode run (``sim/decode_run.py``) takes the step that finishes its first request as its
last step (``run_length(..., through_finish=True)``), applied by the replica as an ordinary step
(``SimReplica._finish_run``): the same result as the step-by-step loop, request by request,
without a plan and an event of its own for that step. Where the machine's CPU is modelled
(``cores``, ``fleet_contention``) a run keeps its first step's factor, so the finishing step is
planned on its own there, as before."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sim_inputs import cost

from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.outcome import Outcome
from loraplex.sim.replica import SimReplica
from loraplex.sim.run import simulate
from loraplex.sim.scale import synthetic_trace
from loraplex.sim.trace import TraceRecord


def _finishing_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per decode run that reached its last step: the requests that step finished."""
    finished: list[int] = []
    finish_run = SimReplica._finish_run

    def spy(self: SimReplica) -> None:
        live = self.num_live
        finish_run(self)
        finished.append(live - self.num_live)

    monkeypatch.setattr(SimReplica, "_finish_run", spy)
    return finished


def _both(
    trace: list[TraceRecord], config: SimConfig, model: CostModel
) -> tuple[tuple[str, list[Outcome]], tuple[str, list[Outcome]]]:
    runs = []
    for skip_steps in (False, True):
        kept: list[Outcome] = []
        result = simulate(trace, config, model, skip_steps=skip_steps, keep_outcomes=kept)
        runs.append((result.to_json(), kept))
    return runs[0], runs[1]


def test_runs_through_a_finish_give_every_request_the_step_by_step_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    finished = _finishing_runs(monkeypatch)
    trace = synthetic_trace(600, 120, 20.0 * 4, seed=3)
    stepped, bulk = _both(trace, SimConfig(replicas=4, max_loras=4), cost())
    assert bulk[1] == stepped[1]  # every request's times, tier, replica and reason
    assert bulk[0] == stepped[0]
    assert sum(1 for n in finished if n > 0) > 100  # runs did end by finishing a request


def test_a_run_ends_where_a_context_fills(monkeypatch: pytest.MonkeyPatch) -> None:
    # 40 prompt tokens and 56 out in a 96-token context: each ends when it is full (more out
    # is refused at arrival, as the server refuses it).
    finished = _finishing_runs(monkeypatch)
    trace = [TraceRecord(0.01 * i, f"t{i % 2}", f"a{i % 3}", 40, 56, rank=8) for i in range(12)]
    stepped, bulk = _both(trace, SimConfig(max_model_len=96, max_loras=2), cost())
    assert bulk == stepped
    assert {o.output_tokens for o in bulk[1]} == {96 - 40}
    assert any(finished)


@pytest.mark.parametrize("cores", [1, 2])
def test_with_the_cpu_modelled_the_finishing_step_is_planned_on_its_own(
    monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    finished = _finishing_runs(monkeypatch)
    trace = synthetic_trace(300, 60, 20.0 * 3, seed=3)
    simulate(trace, SimConfig(replicas=3, max_loras=4), replace(cost(), cores=cores))
    assert finished and not any(finished)
