"""The simulator's speed work changed how fast it runs, not what it computes: every case of
``sim_golden.py`` gives the result (its ``to_json()``, hashed) that the code before that work
gave (commit ba7c122, recorded with ``sim_golden.CASES``).

Recorded again when ``SimConfig`` gained ``step_work_ratio`` (the engine's per-step work share,
``engine/sched/step_share.py``): every result now carries that field; with it 0 (off) the
``hot-classes-shared-cpu`` result was compared field for field with the one recorded at ba7c122
and was the same but for the new field. The hashes below are with the default (1.0).

Recorded again for ``hot-fleet`` and ``scale-8`` (the fleet cases) when the router's rule 4
changed (every replica saturated: the score decides, not the least loaded replica;
docs/router.md): they route differently now (L0 hit ratio 0.4817 -> 0.5138 and 0.488 -> 0.544,
P99 TTFT 63.6 -> 58.3 and 58.0 -> 58.2 ms); the single-replica cases are unchanged.

Recorded again for ``zipf-tight-kv`` when ``SimConfig`` gained ``loraplex serve``'s KV rule
(``num_kv_blocks`` x ``block_size`` >= ``max_model_len``): its 24 x 16 = 384 tokens held no
2048-token sequence, so it now passes ``max_model_len`` 384 (its requests reach 80 tokens). Run
both ways, its metrics were equal and the result differed only in ``config.max_model_len``
(2048 -> 384); the 2048 run still gave the hash recorded before (6e48815b...)."""

from __future__ import annotations

import gc

import pytest
from sim_golden import CASES, digest
from sim_inputs import cost

from loraplex.sim import run
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome, OutcomeLog
from loraplex.sim.run import simulate
from loraplex.sim.scale import synthetic_trace

RECORDED = {
    "zipf-single": "d1e7489150fdffbac54caf41aa944301818f3b60c844e4c7d72b1949090d695b",
    "hot-fleet": "c8fd5e38e9165592a5d6d17bf1332399598a1339be83572b4a22d4e97209b69d",
    "cold-scarce": "6f53964a6f04fcca45c07fa2e9fe5250d7f762682074efa029bef4f8c7390f7c",
    "hot-classes-shared-cpu": "d33bd3299a49e6f4408c44c088d5ce9d5b978aaec87eef8995c6118bae05b382",
    "zipf-tight-kv": "efc7d28dcdd8bcf6f701f06d3ef59e9ffa6e3f1bfc6279974e224118d42f324e",
    "scale-8": "a573727330b072ed6e5ad88891707d006e370885dbd8885a454f1f75098725bf",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_result_is_the_one_recorded_before_the_speed_work(name: str) -> None:
    assert digest(CASES[name]()) == RECORDED[name]


def test_steady_decode_steps_in_bulk_give_the_step_by_step_result() -> None:
    """The same trace with every step its own event and with steady decode runs in bulk
    (``sim/decode_run.py``): the same result, byte for byte, the same engine steps."""
    trace = synthetic_trace(400, 60, 20.0 * 3, seed=1)
    config = SimConfig(replicas=3, max_loras=4, auto_warm_interval_s=1.0)
    slow, fast = (simulate(trace, config, cost(), skip_steps=s) for s in (False, True))
    assert fast.to_json() == slow.to_json()
    assert fast.metrics["engine_steps"] == slow.metrics["engine_steps"] > 5 * len(trace)


@pytest.mark.parametrize("name", ["hot-fleet", "scale-8", "cold-scarce"])
def test_sealing_ended_outcomes_changes_no_figure(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run seals ended outcomes into tuples every ``seal_every`` requests (4096: none in these
    small cases): sealed every 3, every case still gives the result recorded before."""
    logs: list[OutcomeLog] = []

    def often() -> OutcomeLog:
        logs.append(OutcomeLog(seal_every=3))
        return logs[-1]

    monkeypatch.setattr(run, "OutcomeLog", often)
    assert digest(CASES[name]()) == RECORDED[name]
    (log,) = logs
    assert log.num_sealed > len(log.outcomes()) // 2


def test_an_outcome_log_gives_back_every_outcome_in_order() -> None:
    log = OutcomeLog(seal_every=2)
    made = [Outcome(float(i), f"t{i}", replica=i, reason=f"r{i}") for i in range(7)]
    for i, outcome in enumerate(made):
        log.add(outcome)
        outcome.tier, outcome.first_token_s, outcome.output_tokens = "L1", i + 0.25, i + 3
        if i % 3 == 0:  # ends once added: sealed by the next seal
            outcome.end_s, outcome.error = i + 0.5, "QueueTimeoutError"
    made[1].end_s = 9.0  # ends late: sealed by the first seal after it ended
    log.add(extra := Outcome(8.0, "t8", replica=2, reason="gpu_hit"))
    # seals at 2, 4, 6 and 8 outcomes: 0 at the first, 3 at the third, 1 and 6 at the fourth
    assert log.num_sealed == 4
    assert log.outcomes() == [*made, extra]
    assert all(type(o) is Outcome for o in log.outcomes())
    with pytest.raises(ValueError, match="seal_every 0"):
        OutcomeLog(seal_every=0)


def test_a_run_collects_its_young_generation_less_often_and_restores_the_thresholds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``simulate`` raises the collector's first threshold for the run only (``run._frozen_heap``)
    and puts every threshold back after it, also when the run fails."""
    seen: list[tuple[int, int, int]] = []

    def fails(*args: object) -> None:
        seen.append(gc.get_threshold())
        raise RuntimeError("stop")

    before = gc.get_threshold()
    monkeypatch.setattr(run, "_simulate", fails)
    with pytest.raises(RuntimeError, match="stop"):
        simulate([], SimConfig(), cost())
    assert seen == [(max(before[0], run.YOUNG_COLLECTION_EVERY), *before[1:])]
    assert seen[0][0] > 700 and gc.get_threshold() == before
