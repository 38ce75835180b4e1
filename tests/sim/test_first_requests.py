"""A fresh server's one-time seconds (``CostModel.first_load_s``, ``first_step_s``,
``first_hop_s``): read, written and refused by name; each charged once, to the first fetch of a
replica, its first step and the run's first hop; a file without them simulates as before."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import cost

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.ledger import Tier
from loraplex.residency.pipeline import CancelToken, Footprint, Move
from loraplex.residency.stats import Stage
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import FIRST_KEYS, CostModel, from_dict, load
from loraplex.sim.outcome import Outcome
from loraplex.sim.pipeline import CostModelPipeline
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

FIRST = {"first_load_s": 0.011, "first_step_s": 0.004, "first_hop_s": 0.009}


def _model(**values: float) -> CostModel:
    return replace(cost(), **values)


def test_the_keys_round_trip_and_a_file_without_them_reads_as_zero(tmp_path: Path) -> None:
    model = _model(**FIRST)
    model.save(tmp_path / "first.json")
    again = load(tmp_path / "first.json")
    assert again == model
    for key, value in FIRST.items():
        assert getattr(again, key) == value
        assert json.loads(model.to_json())[key] == value
        assert getattr(cost(), key) == 0.0  # the example file has none
        assert key not in json.loads(cost().to_json())
    assert set(FIRST) == set(FIRST_KEYS)


@pytest.mark.parametrize("key", FIRST_KEYS)
@pytest.mark.parametrize("value", [-0.001, "1", True])
def test_a_bad_value_is_refused_by_name(key: str, value: object) -> None:
    body = json.loads(cost().to_json())
    body[key] = value
    with pytest.raises(ValueError, match=key):
        from_dict(body)


def test_the_pipeline_charges_the_first_fetch_only() -> None:
    """The first L3 -> L2 stage costs its price plus ``first_load_s``, and so much CPU is
    charged; the read, the copy and a second fetch their price alone."""
    model = _model(first_load_s=0.011)
    a = AdapterKey("a" * 64, "t", "a", "r1", "b" * 64)
    b = AdapterKey("c" * 64, "t", "b", "r1", "d" * 64)
    charged: list[float] = []
    fps = {a: Footprint(1000, 4000, 4000), b: Footprint(1000, 4000, 4000)}
    pipe = CostModelPipeline(fps, model, charged.append)
    price = model.links["L3_to_L2"].seconds(4000)
    first = pipe.prepare(Move(a, Tier.L3, Tier.L2), CancelToken()).seconds[Stage.FETCH]
    read = pipe.prepare(Move(a, Tier.L2, Tier.L1), CancelToken()).seconds[Stage.READ]
    second = pipe.prepare(Move(b, Tier.L3, Tier.L2), CancelToken()).seconds[Stage.FETCH]
    assert first == pytest.approx(price + 0.011)
    assert read == pytest.approx(model.links["L2_to_L1"].seconds(4000))
    assert second == pytest.approx(price)
    assert charged[0] == pytest.approx(price + 0.011)


def _ttfts(model: CostModel, trace: list[TraceRecord], replicas: int = 1) -> list[float]:
    kept: list[Outcome] = []
    simulate(trace, SimConfig(replicas=replicas), model, keep_outcomes=kept)
    return [o.first_token_s - o.t_s for o in sorted(kept, key=lambda o: o.t_s) if o.first_token_s]


# Two lone cold requests, far apart: nothing runs beside either.
LONE = [TraceRecord(0.0, "t", "a", 16, 4), TraceRecord(5.0, "t", "b", 16, 4)]


@pytest.mark.parametrize("key", FIRST_KEYS)
def test_the_first_request_pays_each_key_once_and_the_second_nothing(key: str) -> None:
    """A lone cold request's TTFT grows by exactly the key's seconds (its load, step or hop is
    the run's first); the next request's does not move."""
    before = _ttfts(cost(), LONE)
    after = _ttfts(_model(**{key: FIRST[key]}), LONE)
    assert after[0] - before[0] == pytest.approx(FIRST[key])
    assert after[1] == pytest.approx(before[1])


def test_all_three_add_up_on_the_first_request() -> None:
    before, after = _ttfts(cost(), LONE), _ttfts(_model(**FIRST), LONE)
    assert after[0] - before[0] == pytest.approx(sum(FIRST.values()))
    assert after[1] == pytest.approx(before[1])


def test_a_decode_run_does_not_repeat_the_first_step() -> None:
    """A long request's later tokens come as without the key: its decode steps (a steady run)
    do not carry the first step's seconds."""
    long = [TraceRecord(0.0, "t", "a", 16, 64)]
    kept: dict[float, list[Outcome]] = {}
    for seconds in (0.0, 0.004):
        out: list[Outcome] = []
        simulate(long, SimConfig(), _model(first_step_s=seconds), keep_outcomes=out)
        kept[seconds] = out
    (before,), (after,) = kept[0.0], kept[0.004]
    assert after.first_token_s - before.first_token_s == pytest.approx(0.004)
    assert after.end_s - before.end_s == pytest.approx(0.004)
