"""The baselines ``loraplex bench cache`` puts beside the cache's loads: a raw read of the same
bytes (hash plus a safetensors read that touches every tensor) and PEFT's ``load_adapter``."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from loraplex.artifacts.identity import sha256_file


def raw_read(path: Path) -> float:
    """sha256 of the file plus a safetensors read whose tensors are actually touched."""
    from safetensors.torch import load_file

    start = time.perf_counter()
    sha256_file(path)
    for tensor in load_file(str(path)).values():
        tensor.clone()
    return time.perf_counter() - start


class PeftLoader:
    """PEFT's load_adapter on the same base model, the baseline being compared against."""

    def __init__(self, model_dir: Path, first_adapter: Path) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model = PeftModel.from_pretrained(model, str(first_adapter), adapter_name="first")
        self.count = 0

    def load(self, adapter_dir: Path) -> float:
        self.count += 1
        name = f"bench{self.count}"
        start = time.perf_counter()
        self.model.load_adapter(str(adapter_dir), adapter_name=name)
        elapsed = time.perf_counter() - start
        self.model.delete_adapter(name)
        return elapsed
