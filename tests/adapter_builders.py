"""Builders for tiny adapter directories, written byte by byte so tests can corrupt any part."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.manifest import parse_adapter_config
from loraplex.artifacts.validate import injected_modules

BASE_NAME = "tiny-llama"
BASE_DIGEST = "ab" * 32


@dataclass
class RawTensor:
    """A tensor as it will be written: safetensors dtype code, shape and raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


def encode(values: np.ndarray, dtype: str) -> bytes:
    """float32 values -> raw bytes of ``dtype`` (bf16 by truncating the float32 bit pattern)."""
    values = np.ascontiguousarray(values, dtype="<f4")
    if dtype == "F32":
        return values.tobytes()
    if dtype == "F16":
        return values.astype("<f2").tobytes()
    if dtype == "BF16":
        return (values.view("<u4") >> 16).astype("<u2").tobytes()
    raise ValueError(dtype)


def safetensors_bytes(
    tensors: dict[str, RawTensor], metadata: dict[str, str] | None = None
) -> bytes:
    """A well-formed safetensors file: tensors laid out contiguously in the given order."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, tensor in tensors.items():
        header[name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(tensor.data)],
        }
        offset += len(tensor.data)
    return raw_file(json.dumps(header).encode(), b"".join(t.data for t in tensors.values()))


def raw_file(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def default_config(**overrides: object) -> dict[str, object]:
    config: dict[str, object] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": f"some/dir/{BASE_NAME}",
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj", "down_proj"],
        "bias": "none",
        "use_dora": False,
        "use_rslora": False,
        "modules_to_save": None,
        "fan_in_fan_out": False,
    }
    config.update(overrides)
    return config


@dataclass
class AdapterBuilder:
    """Writes ``adapter_config.json`` + ``adapter_model.safetensors`` matching ``base``."""

    root: Path
    base: BaseModelSpec
    count: list[int] = field(default_factory=lambda: [0])

    def tensors(self, config: dict[str, object], dtype: str = "F32") -> dict[str, RawTensor]:
        """Correct tensors for ``config`` with small deterministic random values."""
        rng = np.random.default_rng(0)
        spec = parse_adapter_config(config)
        out: dict[str, RawTensor] = {}
        for module in injected_modules(spec, self.base):
            path = BaseModelSpec.module_path(module.layer, module.module)
            for kind, shape in (
                ("A", (module.rank, module.d_in)),
                ("B", (module.d_out, module.rank)),
            ):
                values = rng.standard_normal(shape).astype("<f4")
                out[f"base_model.model.{path}.lora_{kind}.weight"] = RawTensor(
                    dtype, shape, encode(values, dtype)
                )
        return out

    def write(
        self,
        config: dict[str, object] | None = None,
        tensors: dict[str, RawTensor] | None = None,
        weights: bytes | None = None,
    ) -> Path:
        """A fresh adapter directory; ``weights`` (raw file bytes) overrides ``tensors``."""
        self.count[0] += 1
        directory = self.root / f"adapter{self.count[0]}"
        directory.mkdir()
        config = default_config() if config is None else config
        (directory / "adapter_config.json").write_text(json.dumps(config))
        if weights is None:
            weights = safetensors_bytes(self.tensors(config) if tensors is None else tensors)
        (directory / "adapter_model.safetensors").write_bytes(weights)
        return directory


def tiny_base(name: str = BASE_NAME) -> BaseModelSpec:
    """2 layers, hidden 16, GQA 4 query / 2 kv heads of width 4, MLP width 24."""
    config: dict[str, object] = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32,
    }
    return BaseModelSpec.from_config(name, config, BASE_DIGEST)


@pytest.fixture
def base() -> BaseModelSpec:
    return tiny_base()


@pytest.fixture
def builder(tmp_path: Path, base: BaseModelSpec) -> AdapterBuilder:
    return AdapterBuilder(tmp_path, base)


@dataclass(frozen=True)
class Kit:
    """The module-level helpers, handed to tests as a fixture (test dirs are not packages)."""

    RawTensor: type[RawTensor]
    encode: Callable[[np.ndarray, str], bytes]
    safetensors_bytes: Callable[..., bytes]
    raw_file: Callable[[bytes, bytes], bytes]
    config: Callable[..., dict[str, object]]
    tiny_base: Callable[..., BaseModelSpec]


@pytest.fixture
def kit() -> Kit:
    return Kit(RawTensor, encode, safetensors_bytes, raw_file, default_config, tiny_base)
