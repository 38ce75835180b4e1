"""The strategies of one replay-shaped step, merged and unmerged (issue 28; docs/modes.md,
twenty-second pass).

On ``bench modes``' setup (small preset, 16 adapters): 19 decoding sequences (15 on the hot
revision, one each on slots 3, 7, 11 and 14) over a 64-token context, plus one new 64-token
prompt of slot 5 (``foreign``), of the hot revision (``hot``), or no prompt but a 20th decoding
sequence (``none``). Variants, interleaved (``interleaved_medians``, 5 calls a round), medians
in ms: ``base`` (no LoRA), ``unmerged`` (the pool, ``auto``), ``unmerged_masked`` /
``unmerged_grouped`` (forced), ``hot_as_base`` (the hot sequences on the base model), ``merged``
(the hot revision merged, ``auto``'s fused plan) and ``merged_masked`` / ``merged_grouped``
(the fused plan forced, without the float32 pass). Every variant runs while the hot revision
is merged (timing only: the values do not matter).

Prints one JSON line. Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/modes-replay-split/step_strategies.py
bfloat16 5 foreign`` (arguments: dtype, rounds, prompt: foreign | hot | none).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from loraplex.bench.execution.timing import interleaved_medians
from loraplex.bench.modes.setup import HOT, BackendView, ModesBenchConfig, Setup
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch, LoraApplier
from loraplex.model.merge import MergedLoraApplier
from loraplex.ops import LoraBatch
from loraplex.ops.merged_op import fused_plan

DECODING = [HOT] * 15 + [3, 7, 11, 14]
PROMPT_SLOT = {"foreign": 5, "hot": HOT, "none": 9}
CONTEXT = 64


class ForcedMerged:
    """The merged applier with its fused plan forced to one strategy (no float32 pass)."""

    def __init__(self, merged: MergedLoraApplier, backend: str) -> None:
        self.merged, self.backend = merged, backend
        self.last_strategy = backend

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        slots = token_slots.to(torch.int64)
        layout = self.merged.pool.layout
        return fused_plan(
            slots, self.merged.merged_slot, layout, self.backend, None, float32_max_tokens=0
        )

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        return self.merged.apply(layer, module, x, out, batch)


def step_slots(prompt: str) -> list[int]:
    """Each token's slot: the 19 decoding sequences' tokens, then the prompt's (or a 20th)."""
    last = PROMPT_SLOT[prompt]
    return DECODING + [last] * (1 if prompt == "none" else CONTEXT)


def main(dtype: str, rounds: int, prompt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), ModesBenchConfig(batch_size=20, dtype=dtype))
        model = setup.model
        kv = ContiguousKVCache(
            model.attention_shape, 20, 2 * CONTEXT, dtype=model.dtype, device=model.device
        )
        seqs = [kv.allocate() for _ in range(20)]
        ids = torch.randint(3, model.config.vocab_size, (20 * CONTEXT,))
        per_seq = [*DECODING, PROMPT_SLOT[prompt]]
        filled = [slot for slot in per_seq for _ in range(CONTEXT)]
        chunks = [SequenceChunk(seq, 0, CONTEXT) for seq in seqs]
        with torch.no_grad():
            model.forward_batch(ForwardBatch.build(ids, chunks, token_slots=filled), kv, setup.pool)
        last = (
            SequenceChunk(seqs[19], CONTEXT, 1)
            if prompt == "none"
            else SequenceChunk(seqs[19], 0, CONTEXT)
        )
        step = [SequenceChunk(seq, CONTEXT, 1) for seq in seqs[:19]] + [last]
        slots = step_slots(prompt)
        batch = ForwardBatch.build(ids[: len(slots)], step, token_slots=slots)
        hot_base = [-1 if slot == HOT else slot for slot in slots]
        as_base = ForwardBatch.build(ids[: len(slots)], step, token_slots=hot_base)
        merged = setup.merge(HOT)
        appliers: dict[str, tuple[ForwardBatch, LoraApplier | None]] = {
            "base": (batch, None),
            "unmerged": (batch, setup.pool),
            "unmerged_masked": (batch, BackendView(setup.pool, "masked")),
            "unmerged_grouped": (batch, BackendView(setup.pool, "grouped")),
            "hot_as_base": (as_base, setup.pool),
            "merged": (batch, merged),
            "merged_masked": (batch, ForcedMerged(merged, "masked")),
            "merged_grouped": (batch, ForcedMerged(merged, "grouped")),
        }
        fns: dict[str, Callable[[], object]] = {
            name: (lambda b=b, lora=lora: model.forward_batch(b, kv, lora))
            for name, (b, lora) in appliers.items()
        }
        with torch.no_grad():
            medians = interleaved_medians(fns, rounds=rounds, calls_per_round=5)
        token_slots = torch.tensor(slots)
        chose = {"merged": merged.prepare(token_slots).strategy.value}
        chose["unmerged"] = setup.pool.prepare(token_slots).strategy.value
        setup.unmerge()
    ms = {name: round(seconds * 1000, 3) for name, seconds in medians.items()}
    sys.stdout.write(
        json.dumps({"dtype": dtype, "prompt": prompt, "auto_chose": chose, "ms": ms}) + "\n"
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
