"""The demo's first generation prints no third-party deprecation warning a new operator could
take for a loraplex fault (``loraplex serve``'s first start printed peft's FutureWarning)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from peft import LoraConfig
from transformers import LlamaConfig, LlamaForCausalLM

from loraplex.demo.adapters import with_lora
from loraplex.demo.base import save_model


def _tiny() -> LlamaForCausalLM:
    shape = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32}
    tiny = LlamaConfig(**shape, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(tiny)


def test_injecting_a_lora_warns_nothing() -> None:
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = with_lora(_tiny(), config)
    assert [str(w.message) for w in seen] == []
    assert any("lora_A" in name for name, _ in model.named_parameters())


def test_saving_the_base_model_draws_no_progress_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first start printed "Writing model shards: 100%|...| 1/1" for one small file."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    save_model(_tiny(), tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert "Writing" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # put back as it was
