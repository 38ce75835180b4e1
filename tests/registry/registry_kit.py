"""Helpers for registry tests, importable from test processes and from spawned children.

A tiny hand-written Llama checkpoint (config.json + one-tensor model.safetensors) and PEFT adapter
directories written with numpy + safetensors (torch-free, so children start fast).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.registry import (
    RegistrationRequest,
    Registry,
    RegistryConfig,
    TenantQuotas,
    open_registry,
)

BASE_NAME = "tiny-llama"
_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32,
}


def write_base_model(root: Path, name: str = BASE_NAME, seed: int = 0) -> Path:
    """A directory BaseModelSpec.from_dir accepts; ``seed`` changes the weights (and digest)."""
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(_CONFIG))
    weights = np.random.default_rng(seed).standard_normal((4, 4)).astype(np.float32)
    save_file({"model.embed_tokens.weight": weights}, str(model_dir / "model.safetensors"))
    return model_dir


def write_adapter(
    directory: Path,
    base: BaseModelSpec,
    seed: int = 0,
    rank: int = 4,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    base_name: str = BASE_NAME,
) -> Path:
    """A valid PEFT LoRA directory for ``base``; different seeds give different bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(modules),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(base.num_layers):
        for module in modules:
            d_in, d_out = base.module_shape(module)
            prefix = f"base_model.model.{BaseModelSpec.module_path(layer, module)}"
            tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((rank, d_in)).astype("<f4")
            tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((d_out, rank)).astype("<f4")
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


class StepClock:
    """Wall-clock stand-in: each call is one second later (deterministic created_at)."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._ticks = itertools.count()
        self._start_s = start_s

    def __call__(self) -> float:
        return self._start_s + next(self._ticks)


def register_many(
    config: RegistryConfig, model_dir: Path, jobs: list[tuple[str, str, str]], tenant: str
) -> None:
    """Child-process body: register ``(adapter_dir, name, revision)`` jobs one by one."""
    registry = open_registry(config, BaseModelSpec.from_dir(model_dir))
    try:
        for adapter_dir, name, revision in jobs:
            request = RegistrationRequest(Path(adapter_dir), tenant, name, revision)
            registry.register(request, f"pid:{os.getpid()}")
    finally:
        registry.close()


def _crash_child(argv: list[str]) -> None:
    """``python registry_kit.py CONFIG_JSON MODEL_DIR ADAPTER_DIR MARKER STAGE``.

    Registers ``acme/crash@v1``; when registration reaches STAGE it writes MARKER and sleeps, so
    the parent can SIGKILL it exactly there. STAGE "none" prints "ready" and registers at once
    (the parent kills it at a random moment).
    """
    config_json, model_dir, adapter_dir, marker, stage = argv
    raw = json.loads(config_json)
    config = RegistryConfig(
        data_dir=Path(raw["data_dir"]),
        database_url=raw["database_url"],
        store=raw["store"],
        s3_endpoint=raw["s3_endpoint"],
    )

    def hook(reached: str) -> None:
        if reached == stage:
            Path(marker).write_text(reached)
            time.sleep(60)

    registry = open_registry(config, BaseModelSpec.from_dir(Path(model_dir)), stage_hook=hook)
    if stage == "none":
        sys.stdout.write("ready\n")
        sys.stdout.flush()
    registry.register(RegistrationRequest(Path(adapter_dir), "acme", "crash", "v1"), "crash-test")


def config_json(config: RegistryConfig) -> str:
    return json.dumps(
        {
            "data_dir": str(config.data_dir),
            "database_url": config.database_url,
            "store": config.store,
            "s3_endpoint": config.s3_endpoint,
        }
    )


UNLIMITED = TenantQuotas()
# open_reg(**overrides) -> a Registry on the test's database and store.
OpenRegistry = Callable[..., Registry]
# make_adapter(label, seed=0, rank=4, modules=..., base_name=...) -> adapter directory.
AdapterFactory = Callable[..., Path]


@dataclass(frozen=True)
class S3Target:
    """A fresh bucket on the moto server."""

    endpoint: str  # endpoint URL
    bucket: str  # bucket name
    client: Any  # boto3 S3 client for poking at objects directly


if __name__ == "__main__":
    _crash_child(sys.argv[1:])
