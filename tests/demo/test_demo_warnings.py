"""The demo's first generation prints no third-party deprecation warning a new operator could
take for a loraplex fault (``loraplex serve``'s first start printed peft's FutureWarning)."""

from __future__ import annotations

import warnings

from peft import LoraConfig
from transformers import LlamaConfig, LlamaForCausalLM

from loraplex.demo.adapters import with_lora


def test_injecting_a_lora_warns_nothing() -> None:
    shape = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32}
    tiny = LlamaConfig(**shape, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = with_lora(LlamaForCausalLM(tiny), config)
    assert [str(w.message) for w in seen] == []
    assert any("lora_A" in name for name, _ in model.named_parameters())
