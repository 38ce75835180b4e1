"""Adapters with a demo preset's shapes and random weights, written in seconds (no training).

A cold load's cost depends on the adapter's shapes and bytes, not on what its weights learnt,
so ``bench signing --synthetic`` measures the large preset's load sizes without generating its
demo set (which trains a base model and every adapter). Torch-free (numpy + safetensors).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.demo.presets import AdapterPlan, get_preset


def write_shaped_set(root: Path, preset_name: str, count: int) -> tuple[Path, list[Path]]:
    """(base model directory, adapter directories) for the preset's first ``count`` plans."""
    preset = get_preset(preset_name)
    base_dir = root / f"shaped-{preset.name}"
    base_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_layers,
        "num_attention_heads": preset.num_heads,
        "num_key_value_heads": preset.num_kv_heads,
        "vocab_size": preset.max_vocab_size,
    }
    (base_dir / "config.json").write_text(json.dumps(config))
    save_file(
        {"model.embed_tokens.weight": np.zeros((4, 4), "<f4")}, str(base_dir / "model.safetensors")
    )
    base = BaseModelSpec.from_dir(base_dir)
    rng = np.random.default_rng(0)
    plans = preset.adapters[:count]
    dirs = [_write(root / f"{p.tenant}-{p.name}-{p.revision}", p, base, rng) for p in plans]
    return base_dir, dirs


def _write(folder: Path, plan: AdapterPlan, base: BaseModelSpec, rng: np.random.Generator) -> Path:
    """Every layer, the plan's rank and modules (rank and layer patterns are not reproduced)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base.name,
        "r": plan.rank,
        "lora_alpha": plan.lora_alpha,
        "target_modules": list(plan.target_modules),
        "bias": "none",
        "use_rslora": plan.use_rslora,
        "use_dora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for layer in range(base.num_layers):
        for module in plan.target_modules:
            d_in, d_out = base.module_shape(module)
            prefix = f"base_model.model.{BaseModelSpec.module_path(layer, module)}"
            a = 0.01 * rng.standard_normal((plan.rank, d_in))
            b = 0.01 * rng.standard_normal((d_out, plan.rank))
            tensors[f"{prefix}.lora_A.weight"] = a.astype("<f4")
            tensors[f"{prefix}.lora_B.weight"] = b.astype("<f4")
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder
