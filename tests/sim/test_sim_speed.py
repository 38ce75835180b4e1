"""The simulator's speed work changed how fast it runs, not what it computes: every case of
``sim_golden.py`` gives the result (its ``to_json()``, hashed) that the code before that work
gave (commit ba7c122, recorded with ``sim_golden.CASES``)."""

from __future__ import annotations

import pytest
from sim_golden import CASES, digest
from sim_inputs import cost

from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
from loraplex.sim.scale import synthetic_trace

RECORDED = {
    "zipf-single": "90fce466ae5dd73c2594d77976af3ab76d7b2729454c65db8401460b43b6cbad",
    "hot-fleet": "a930df17953aac91f999f6fa40a65fa4f3b56befbc6778ea9caa4260bf1fb2af",
    "cold-scarce": "f2a6856bd04eee48d6b0cd586ede46abd0a9d468499e0a2feb643dc460dc462b",
    "hot-classes-shared-cpu": "345314b24bdf246c0d14a5b4b633f82c7b0327fa228b263c8fd167177d3275ac",
    "zipf-tight-kv": "29752995d2c9405982cb5041e54dc3c3cc90a1b89aa88c4bd546e7029389d8e4",
    "scale-8": "a0979dab707a89fd995eab5de721c2640586f8aead653b8e294e682c0501d76b",
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
