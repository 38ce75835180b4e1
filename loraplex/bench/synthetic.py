"""Many tiny adapters, fast: rank-1 LoRA on every layer's ``q_proj``, one value differing per
index so every adapter has its own digest (the scale benchmark caches thousands of them).

Torch-free (numpy + safetensors), and deterministic: index ``i`` always gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.validate import WEIGHTS_FILE

RANK = 1
MODULE = "q_proj"
NUM_TENANTS = 50  # copies are spread over this many tenants, like a shared server's


@dataclass(frozen=True)
class SyntheticAdapter:
    """One generated adapter: its key and its two files' bytes."""

    key: AdapterKey  # identity on the base model (tenant t<i % 50>, name a<i>, revision r1)
    config: bytes  # adapter_config.json
    weights: bytes  # adapter_model.safetensors

    @property
    def size_bytes(self) -> int:
        return len(self.config) + len(self.weights)

    def write(self, folder: Path) -> Path:
        """The PEFT directory ``folder`` with both files."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_bytes(self.config)
        (folder / WEIGHTS_FILE).write_bytes(self.weights)
        return folder


class SyntheticAdapters:
    """Adapter ``i`` for ``base``, built from one template (a copy and one changed value)."""

    def __init__(self, base: BaseModelSpec, seed: int = 0) -> None:
        self._base = base
        rng = np.random.default_rng(seed)
        d_in, d_out = base.module_shape(MODULE)
        self._tensors: dict[str, np.ndarray] = {}
        for layer in range(base.num_layers):
            prefix = f"base_model.model.{BaseModelSpec.module_path(layer, MODULE)}"
            a = (0.01 * rng.standard_normal((RANK, d_in))).astype("<f4")
            b = (0.01 * rng.standard_normal((d_out, RANK))).astype("<f4")
            self._tensors[f"{prefix}.lora_A.weight"] = a
            self._tensors[f"{prefix}.lora_B.weight"] = b
        self._first_b = f"base_model.model.{BaseModelSpec.module_path(0, MODULE)}.lora_B.weight"
        self._config = json.dumps(_config(base.name), indent=2).encode()

    def adapter(self, index: int, tenant_prefix: str = "t") -> SyntheticAdapter:
        tensors = dict(self._tensors)
        first_b = tensors[self._first_b].copy()
        first_b[0, 0] = np.float32(1e-6 * (index + 1))  # the one value that differs
        tensors[self._first_b] = first_b
        weights = save(tensors)
        digest = hashlib.sha256(weights).hexdigest()
        tenant = f"{tenant_prefix}{index % NUM_TENANTS}"
        key = AdapterKey(self._base.digest, tenant, f"a{index}", "r1", digest)
        return SyntheticAdapter(key, self._config, weights)


def _config(base_name: str) -> dict[str, object]:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "target_modules": [MODULE],
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
