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
    assert model.step.seconds(10, 0, 2, 80) == pytest.approx(0.002 + 1e-4 + 2e-4 + 8e-6)
    assert model.links["L1_to_L0"].seconds(10**9) == pytest.approx(1.001)
    priced = replace(model, step=replace(model.step, per_prefill_token_s=3e-6))
    priced.save(tmp_path / "p.json")
    assert load(tmp_path / "p.json") == priced
    assert json.loads(priced.to_json())["step"]["per_prefill_token_s"] == 3e-6


def test_prompt_tokens_are_priced_by_the_prefill_term() -> None:
    step = StepCost(
        step_fixed_s=0.002,
        per_token_s=1e-3,
        per_revision_s=1e-4,
        per_rank_token_s=1e-7,
        per_prefill_token_s=2e-5,
    )
    # 4 decode tokens, 100 prompt tokens, 2 revisions, 104 tokens of rank 8
    expected = 0.002 + 4 * 1e-3 + 100 * 2e-5 + 2 * 1e-4 + 832 * 1e-7
    assert step.seconds(4, 100, 2, 832) == pytest.approx(expected)
    assert step.seconds(4, 101, 2, 832) - step.seconds(4, 100, 2, 832) == pytest.approx(2e-5)
    assert step.seconds(5, 100, 2, 832) - step.seconds(4, 100, 2, 832) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="per_prefill_token_s"):
        replace(step, per_prefill_token_s=-1e-6)


def test_a_file_without_the_prefill_term_keeps_the_old_model(tmp_path: Path) -> None:
    """Files written before the prefill term price a prompt token as a decode token, exactly
    (the same float expression), and are written back without the key."""
    body = json.loads(_model().to_json())
    assert "per_prefill_token_s" not in body["step"]
    old = from_dict(body)
    assert old.step.per_prefill_token_s is None
    step = old.step
    tokens = 0.002 + step.per_token_s * 110 + step.per_revision_s * 2 + step.per_rank_token_s * 880
    assert step.seconds(10, 100, 2, 880) == tokens
    old.save(tmp_path / "old.json")
    assert json.loads((tmp_path / "old.json").read_text())["step"] == body["step"]


def test_unvalidated_model_must_cite_sources() -> None:
    with pytest.raises(ValueError, match="cites no sources"):
        _model(validated=False)
    assert _model(validated=False, sources={"step": "a citation"}).validated is False


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.update(schema="other"), "schema"),
        (lambda b: b.update(extra=1), "unknown keys"),
        (lambda b: b["step"].pop("per_token_s"), r"missing keys \['per_token_s'\]"),
        (lambda b: b["links"].pop("L2_to_L1"), "missing"),
        (lambda b: b["links"]["L1_to_L0"].update(bytes_per_s=0), "bytes_per_s"),
        (lambda b: b["step"].update(per_token_s="fast"), "must be a number"),
        (lambda b: b["step"].update(per_prefill_token_s=None), "per_prefill_token_s"),
        (lambda b: b["step"].update(per_prefill_token_s=-1.0), "per_prefill_token_s"),
        (lambda b: b["step"].update(per_context_token_s=1e-6), "unknown keys.*per_context_token_s"),
        (lambda b: b["step"].update(per_byte_token=1e-12), r"unknown keys \['per_byte_token'\]"),
        (lambda b: b["step"].update(per_byte_token_s=-1e-12), "per_byte_token_s"),
        (lambda b: b["step"].update(per_byte_token_s="cheap"), "per_byte_token_s must be a num"),
        (lambda b: b["step"].update(per_revision_width_s=None), "per_revision_width_s"),
        (lambda b: b.update(front_s=-1), "front_s"),
        (lambda b: b.update(load_cpu_shared="yes"), "load_cpu_shared"),
    ],
)
def test_bad_files_are_refused_by_name(mutate, message) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(_model().to_json())
    mutate(body)
    with pytest.raises(ValueError, match=message):
        from_dict(body)


def test_weight_terms_price_lora_work_by_the_adapters_bytes(tmp_path: Path) -> None:
    """An adapter on every linear layer costs more per token than an attention-only one of the
    same rank (more bytes), and each revision pays once per step for its bytes per rank."""
    step = replace(_model().step, per_byte_token_s=1e-12, per_revision_width_s=2e-9)
    assert step.prices_weights and not _model().step.prices_weights
    base = step.seconds(4, 0, 1, 32)
    # 4 tokens of a 1 MB rank-8 adapter: bytes per rank 131072
    priced = step.seconds(4, 0, 1, 32, byte_tokens=4 << 20, revision_widths=131072.0)
    assert priced - base == pytest.approx(4 * (1 << 20) * 1e-12 + 131072 * 2e-9)
    wider = step.seconds(4, 0, 1, 32, byte_tokens=12 << 20, revision_widths=3 * 131072.0)
    assert wider > priced  # same rank, three times the targets' width
    model = replace(_model(), step=step)
    model.save(tmp_path / "w.json")
    assert load(tmp_path / "w.json") == model
    assert json.loads(model.to_json())["step"]["per_byte_token_s"] == 1e-12


def test_a_file_without_weight_terms_keeps_its_old_meaning(tmp_path: Path) -> None:
    """Files written before the weight terms: the same float expression whatever bytes a step
    holds, and written back without the keys."""
    body = json.loads(_model().to_json())
    old = from_dict(body)
    assert old.step.per_byte_token_s is None and old.step.per_revision_width_s is None
    step = old.step
    expected = (
        0.002 + step.per_token_s * 110 + step.per_revision_s * 2 + step.per_rank_token_s * 880
    )
    assert step.seconds(10, 100, 2, 880, byte_tokens=10**9, revision_widths=1e6) == expected
    old.save(tmp_path / "old.json")
    written = json.loads((tmp_path / "old.json").read_text())["step"]
    assert written == body["step"] and "per_byte_token_s" not in written
