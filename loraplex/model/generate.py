"""Offline generation: a list of (prompt, adapter directory or none, sampling) run as one mixed
batch over the base model and a LoRA slot pool.

``OfflineGenerator`` holds the loaded model, tokenizer and pool so the demo and the engine can
reuse them across calls; ``generate`` is the one-shot convenience.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.errors import CapacityError
from loraplex.model.adapter_weights import load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.decoding import SequenceInput, decode
from loraplex.model.lora import LoraSlotPool
from loraplex.model.tokenizer import TextTokenizer
from loraplex.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue."""

    prompt: str  # text to continue (the tokenizer adds its special tokens, e.g. BOS)
    adapter_dir: Path | None = None  # PEFT adapter directory; None = base model only
    params: SamplingParams = field(default_factory=SamplingParams)  # sampling and stopping


@dataclass(frozen=True)
class GenerationResult:
    """One request's continuation."""

    text: str  # generated text (special tokens skipped, cut before a stop string)
    token_ids: tuple[int, ...]  # generated token ids
    finish_reason: str  # "stop" (EOS or stop string) or "length" (max_tokens)
    prompt_tokens: int  # tokens in the encoded prompt


@dataclass(frozen=True)
class GeneratorConfig:
    """How the model and its LoRA slot pool are set up."""

    dtype: torch.dtype = torch.float32  # compute dtype of weights, activations and KV
    device: str = "cpu"  # torch device string
    max_loras: int = 8  # adapters resident at once (distinct adapters one call may use)
    max_lora_rank: int = 64  # largest adapter rank accepted
    lora_backend: str = "auto"  # loraplex.ops backend name
    max_batch_size: int = 64  # sequences decoded together; more requests run in waves

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank", "max_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype {self.dtype} is invalid; expected float32/bfloat16/float16")
        if self.dtype == torch.float16 and not self.device.startswith("cuda"):
            raise ValueError("dtype float16 is invalid on CPU; expected float32 or bfloat16")


class OfflineGenerator:
    """A loaded base model + tokenizer + LoRA slot pool, reusable across ``generate`` calls.

    Adapters are validated against the base model before anything is loaded, then kept in
    their slots (keyed by content digest) until a later call needs the slot for another one.
    """

    def __init__(self, model_dir: Path, config: GeneratorConfig | None = None) -> None:
        self.config = config or GeneratorConfig()
        self.model_dir = model_dir
        self.base_spec = BaseModelSpec.from_dir(model_dir)
        self.model = load_checkpoint(model_dir, dtype=self.config.dtype, device=self.config.device)
        self.tokenizer = TextTokenizer(model_dir)
        self.pool = LoraSlotPool(
            self.base_spec,
            self.config.max_loras,
            self.config.max_lora_rank,
            dtype=self.config.dtype,
            device=torch.device(self.config.device),
            backend=self.config.lora_backend,
        )
        self._slot_of: dict[str, int] = {}  # adapter digest -> slot holding it

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Continue every request; results are in request order."""
        if not requests:
            return []
        slots = self._load_adapters([r.adapter_dir for r in requests])
        inputs = []
        for request, slot in zip(requests, slots, strict=True):
            prompt_ids = tuple(self.tokenizer.encode(request.prompt))
            if not prompt_ids:
                raise ValueError(f"prompt {request.prompt!r} encodes to no tokens")
            inputs.append(SequenceInput(prompt_ids, slot, request.params))
        results: list[GenerationResult] = []
        size = self.config.max_batch_size
        for start in range(0, len(inputs), size):
            wave = inputs[start : start + size]
            outputs = decode(
                self.model,
                wave,
                eos_token_ids=self.tokenizer.eos_token_ids,
                detokenizer=self.tokenizer,
                lora=self.pool,
            )
            results.extend(
                GenerationResult(o.text, o.token_ids, o.finish_reason, len(i.prompt_ids))
                for i, o in zip(wave, outputs, strict=True)
            )
        return results

    def _load_adapters(self, adapter_dirs: Sequence[Path | None]) -> list[int | None]:
        """Validate each distinct adapter, put it in a slot, and map requests to slots."""
        digests: dict[Path, str] = {}
        pending = {}
        for adapter_dir in dict.fromkeys(d for d in adapter_dirs if d is not None):
            validated = validate_adapter_dir(adapter_dir, self.base_spec, self.config.max_lora_rank)
            digests[adapter_dir] = validated.digest
            if validated.digest not in self._slot_of:
                pending[validated.digest] = validated
        needed = set(digests.values())
        if len(needed) > self.config.max_loras:
            raise CapacityError(
                f"requests use {len(needed)} distinct adapters; max_loras is "
                f"{self.config.max_loras}"
            )
        for digest, validated in pending.items():
            slot = self._free_slot(needed)
            weights = load_adapter_weights(validated, dtype=self.config.dtype)
            self.pool.load(slot, weights)
            self._slot_of[digest] = slot
        return [None if d is None else self._slot_of[digests[d]] for d in adapter_dirs]

    def _free_slot(self, needed: set[str]) -> int:
        """An empty slot, else one whose adapter this call does not use (evicted)."""
        free = self.pool.free_slots()
        if free:
            return free[0]
        keep = {slot for digest, slot in self._slot_of.items() if digest in needed}
        victim = next(s for s in self.pool.occupied_slots() if s not in keep)
        self._slot_of = {d: s for d, s in self._slot_of.items() if s != victim}
        return victim


def generate(
    model_dir: Path,
    requests: Sequence[GenerationRequest],
    config: GeneratorConfig | None = None,
) -> list[GenerationResult]:
    """Load ``model_dir`` and continue ``requests`` as one mixed batch."""
    return OfflineGenerator(model_dir, config).generate(requests)
