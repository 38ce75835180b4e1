"""Offline references: what each revision answers greedily, computed on this machine by the
engine's offline path (``engine/offline.py``) from the revision's own PEFT files.

The served text of a sampled answer must equal its revision's reference; a probe's reference is
scored against the probe's expectation too ("the reference's own score"). NOTE: imports torch
lazily (only ``compute`` does); the rest of ``loraplex.qualify`` stays torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VOCAB_FIRST_ID = 3  # the demo tokenizer's first ordinary token (0-2 are special)


@dataclass(frozen=True)
class Ask:
    """One greedy generation to reproduce offline."""

    adapter_dir: Path | None  # the revision's PEFT directory on this machine; None: base model
    prompt: str | tuple[int, ...]  # text, or token ids as sent
    max_tokens: int  # tokens to generate at most
    ignore_eos: bool  # as sent


def compute(model_dir: Path, asks: list[Ask], max_lora_rank: int) -> dict[Ask, str]:
    """The greedy text of every distinct ask, in one offline engine."""
    from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
    from loraplex.sampling import SamplingParams

    distinct = list(dict.fromkeys(asks))
    if not distinct:
        return {}
    config = OfflineConfig(max_lora_rank=max_lora_rank, max_loras=8, max_num_seqs=16)
    with OfflineEngine(model_dir, config) as engine:
        requests = [
            OfflineRequest(
                ask.prompt,
                ask.adapter_dir,
                SamplingParams(max_tokens=ask.max_tokens, ignore_eos=ask.ignore_eos),
            )
            for ask in distinct
        ]
        results = engine.generate(requests)
    return {ask: result.text for ask, result in zip(distinct, results, strict=True)}
