"""Random PEFT adapters and base checkpoints of a preset's shape, for benchmarks.

Timing does not depend on trained values, so benchmarks write random non-zero weights in
exactly PEFT's on-disk format (``adapter_config.json`` + ``adapter_model.safetensors``) instead
of fine-tuning.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from loraplex.artifacts.base_model import BaseModelSpec

S2_RANKS = (64, 32, 16, 8)


def write_random_adapter(
    base: BaseModelSpec,
    base_dir: Path,
    out: Path,
    *,
    rank: int,
    target_modules: tuple[str, ...],
    seed: int,
    b_std: float = 0.02,
) -> Path:
    """A rank-``rank`` adapter on ``target_modules`` of every layer (alpha = 2 * rank): A with
    unit-variance rows over ``d_in``, B with standard deviation ``b_std`` (the default moves
    the demo model's greedy text for only some prompts; qualification asks for more)."""
    if not b_std > 0:
        raise ValueError(f"b_std {b_std} is invalid; expected > 0")
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(base.num_layers):
        for module in target_modules:
            d_in, d_out = base.module_shape(module)
            prefix = f"base_model.model.{base.module_path(layer, module)}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) / d_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) * b_std
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_dir),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(target_modules),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "fan_in_fan_out": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


def write_random_base(out: Path, preset: str, seed: int) -> Path:
    """An untrained Llama checkpoint with the demo preset's shapes (timing-equivalent)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from loraplex.demo.presets import get_preset

    spec = get_preset(preset)
    config = LlamaConfig(
        vocab_size=spec.max_vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
    return out
