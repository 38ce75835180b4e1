"""Preset and adapter-plan validation (torch-free, fast)."""

from __future__ import annotations

import dataclasses

import pytest

from loraplex.demo.presets import LARGE, SMALL, AdapterPlan, get_preset


def test_plan_rejects_alpha_equal_to_rank() -> None:
    with pytest.raises(ValueError, match="lora_alpha 8 is invalid"):
        AdapterPlan("acme", "x", "r1", 8, 8, ("q_proj",))


def test_plan_rejects_unknown_target_module() -> None:
    with pytest.raises(ValueError, match="target_modules"):
        AdapterPlan("acme", "x", "r1", 8, 16, ("lm_head",))


def test_plan_rejects_bad_names() -> None:
    with pytest.raises(ValueError, match="tenant"):
        AdapterPlan("../etc", "x", "r1", 8, 16, ("q_proj",))


def test_preset_requires_grouped_query_attention() -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(SMALL, num_kv_heads=SMALL.num_heads)


def test_preset_rejects_duplicate_revisions() -> None:
    with pytest.raises(ValueError, match="unique"):
        dataclasses.replace(SMALL, adapters=(SMALL.adapters[0], SMALL.adapters[0]))


def test_get_preset_names_choices() -> None:
    assert get_preset("small") is SMALL
    with pytest.raises(ValueError, match=r"\['large', 'small'\]"):
        get_preset("huge")


def test_large_adds_a_rank_128_adapter() -> None:
    assert max(plan.rank for plan in LARGE.adapters) == 128
    assert max(plan.rank for plan in SMALL.adapters) == 64
    assert LARGE.model_name == "loraplex-demo-large"


def test_adapters_wider_than_the_reference_train_slower() -> None:
    by_ref = {plan.ref: LARGE.adapter_lr_for(plan) for plan in LARGE.adapters}
    assert by_ref["acme/legal@r1"] == by_ref["acme/billing@r1"] == LARGE.adapter_lr  # r 4, 16
    assert by_ref["globex/summarize@r1"] == pytest.approx(LARGE.adapter_lr / 2)  # r 64, alpha 128
    assert by_ref["initech/longform@r1"] < by_ref["globex/summarize@r1"]
    # rsLoRA rank 8, alpha 32: scale 11.3, trains as if 45 wide.
    assert by_ref["initech/chat@r1"] == pytest.approx(LARGE.adapter_lr * (16 / 45.25) ** 0.5, 1e-3)
    # The small preset keeps one rate for every rank.
    assert {SMALL.adapter_lr_for(plan) for plan in SMALL.adapters} == {SMALL.adapter_lr}
