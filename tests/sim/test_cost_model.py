import json
from dataclasses import replace
from pathlib import Path

import pytest

from loraplex.sim.cost_model import CostModel, Link, StepCost, from_dict, load


def _model(validated: bool = True, sources: dict[str, str] | None = None) -> CostModel:
    link = Link(fixed_s=0.001, bytes_per_s=1e9)
    return CostModel(
        hardware="test",
        validated=validated,
        step=StepCost(
            step_fixed_s=0.002, per_token_s=1e-5, per_revision_s=1e-4, per_rank_token_s=1e-7
        ),
        links={"L3_to_L2": link, "L2_to_L1": link, "L1_to_L0": link},
        sources=sources or {},
    )


def test_round_trip(tmp_path: Path) -> None:
    model = _model()
    model.save(tmp_path / "m.json")
    assert load(tmp_path / "m.json") == model
    shared = replace(model, load_cpu_shared=True)
    shared.save(tmp_path / "s.json")
    assert load(tmp_path / "s.json").load_cpu_shared is True
    body = json.loads(model.to_json())
    del body["load_cpu_shared"]  # files written before the key existed: not shared
    assert from_dict(body).load_cpu_shared is False
    assert model.step.seconds(10, 2, 80) == pytest.approx(0.002 + 1e-4 + 2e-4 + 8e-6)
    assert model.links["L1_to_L0"].seconds(10**9) == pytest.approx(1.001)


def test_unvalidated_model_must_cite_sources() -> None:
    with pytest.raises(ValueError, match="cites no sources"):
        _model(validated=False)
    assert _model(validated=False, sources={"step": "a citation"}).validated is False


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.update(schema="other"), "schema"),
        (lambda b: b.update(extra=1), "unknown keys"),
        (lambda b: b["step"].pop("per_token_s"), "differ"),
        (lambda b: b["links"].pop("L2_to_L1"), "missing"),
        (lambda b: b["links"]["L1_to_L0"].update(bytes_per_s=0), "bytes_per_s"),
        (lambda b: b["step"].update(per_token_s="fast"), "must be a number"),
        (lambda b: b.update(front_s=-1), "front_s"),
        (lambda b: b.update(load_cpu_shared="yes"), "load_cpu_shared"),
    ],
)
def test_bad_files_are_refused_by_name(mutate, message) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(_model().to_json())
    mutate(body)
    with pytest.raises(ValueError, match=message):
        from_dict(body)
