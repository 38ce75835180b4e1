"""Step callables for the execution benchmark: loraplex's model + slot pool, and PEFT's mixed batch.

A timed step always does identical work: decode steps write the same KV position each call
(the cache is preallocated, or cropped back for PEFT), prefill steps rewrite the same rows.
Both sides time their own input preparation: loraplex builds its ``ForwardBatch`` (positions,
sequence lengths, logits indices, per-token slots) inside the timed call, as the server's runner
does every step, and the paged KV cache plans its block-table rows inside ``forward_batch``;
PEFT's forward prepares positions, cache positions and masks, and its cache is cropped back.
The KV cache is the server's (``engine.kv.paged.PagedKVCache``, ``KV_BLOCK_SIZE`` tokens per
block, the engine's default), not a contiguous one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.kv.paged import PagedKVCache
from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights, load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import SequenceChunk
from loraplex.model.llama import ForwardBatch
from loraplex.model.lora import LoraSlotPool

KV_BLOCK_SIZE = 16  # EngineConfig.block_size's default: the blocks the server attends over
KV_CACHE = "paged"  # what the benchmark measures (reported with its results)


@dataclass(frozen=True)
class StepShape:
    """What one timed forward processes."""

    batch_size: int  # sequences in the step
    tokens_per_seq: int  # 1 = decode; more = a prefill chunk from position 0
    context_tokens: int  # cached positions each decode token attends to


def token_ids(shape: StepShape, vocab_size: int) -> torch.Tensor:
    """Deterministic ids, [batch_size, tokens_per_seq]."""
    count = shape.batch_size * shape.tokens_per_seq
    return (torch.arange(count, dtype=torch.int64) * 7919 % (vocab_size - 3) + 3).view(
        shape.batch_size, shape.tokens_per_seq
    )


def padded(weights: AdapterWeights, rank: int) -> AdapterWeights:
    """The same adapter with zero rows/columns up to ``rank`` (the padded-layout baseline)."""
    modules = []
    for m in weights.modules:
        extra = rank - m.rank
        lora_a = torch.cat([m.lora_a, m.lora_a.new_zeros(extra, m.lora_a.shape[1])])
        lora_b = torch.cat([m.lora_b, m.lora_b.new_zeros(m.lora_b.shape[0], extra)], dim=1)
        modules.append(ModuleWeights(m.layer, m.module, lora_a, lora_b, m.scale))
    return AdapterWeights(weights.digest, weights.dtype, tuple(modules))


class LoraplexRunner:
    """loraplex's model with one paged KV cache (the server's kind) shared by every variant of a
    dtype; each sequence's blocks are reserved up front, so a timed step allocates none."""

    def __init__(
        self,
        model_dir: Path,
        dtype: torch.dtype,
        max_seqs: int,
        max_seq_len: int,
        device: torch.device | None = None,
        *,
        linear_kernel: str = "auto",
    ):
        self.model_dir, self.dtype = model_dir, dtype
        self.device = device if device is not None else torch.device("cpu")
        self.spec = BaseModelSpec.from_dir(model_dir)
        self.model = load_checkpoint(
            model_dir, dtype=dtype, device=self.device, linear_kernel=linear_kernel
        )
        per_seq = -(-max_seq_len // KV_BLOCK_SIZE)
        blocks = BlockManager(max_seqs * per_seq, KV_BLOCK_SIZE)
        self.kv = PagedKVCache(self.model.attention_shape, blocks, dtype=dtype, device=self.device)
        self.seq_ids = [self.kv.allocate() for _ in range(max_seqs)]
        for seq_id in self.seq_ids:
            blocks.grow(seq_id, max_seq_len)

    def weights(self, adapter_dir: Path, max_lora_rank: int) -> AdapterWeights:
        validated = validate_adapter_dir(adapter_dir, self.spec, max_lora_rank)
        return load_adapter_weights(validated, dtype=self.dtype)

    def pool(
        self, adapters: Sequence[AdapterWeights], backend: str, max_lora_rank: int
    ) -> LoraSlotPool:
        pool = LoraSlotPool(
            self.spec,
            len(adapters),
            max_lora_rank,
            dtype=self.dtype,
            device=self.device,
            backend=backend,
        )
        for slot, weights in enumerate(adapters):
            pool.load(slot, weights)
        return pool

    def step(
        self, shape: StepShape, seq_slots: Sequence[int] | None, pool: LoraSlotPool | None
    ) -> Callable[[], object]:
        """One forward of ``shape``; ``seq_slots`` (one slot per sequence) None = base only."""
        decode = shape.tokens_per_seq == 1
        start = shape.context_tokens if decode else 0
        chunks = [
            SequenceChunk(self.seq_ids[i], start, shape.tokens_per_seq)
            for i in range(shape.batch_size)
        ]
        slots = None
        if seq_slots is not None:
            slots = [slot for slot in seq_slots for _ in range(shape.tokens_per_seq)]
        ids = token_ids(shape, self.spec.vocab_size).flatten().tolist()
        lora = pool if slots is not None else None

        def step() -> object:
            # Built per call, from plain lists, as the server's runner builds it every step.
            batch = ForwardBatch.build(ids, chunks, token_slots=slots, device=self.device)
            return self.model.forward_batch(batch, self.kv, lora)

        return step

    def sync(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def weight_bytes(self) -> int:
        """Bytes a decode step must read: every weight but the embedding table (only a few
        rows are gathered), unless the head is tied to it."""
        tied = self.model.lm_head is None
        return sum(
            p.numel() * p.element_size()
            for name, p in self.model.named_parameters()
            if tied or "embed_tokens" not in name
        )


class PeftRunner:
    """Transformers + PEFT with every adapter loaded; mixed batches via ``adapter_names``."""

    def __init__(
        self,
        model_dir: Path,
        adapter_dirs: Sequence[Path],
        dtype: torch.dtype,
        device: torch.device | None = None,
    ):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        self.device = device if device is not None else torch.device("cpu")
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        model.to(self.device)
        model.eval()
        # NOTE: PEFT's frozen lm_head over a non-contiguous hidden-state slice can turn into a
        # huge batched matmul in bfloat16 on CPU; a contiguous input keeps PEFT at its best.
        model.lm_head.register_forward_pre_hook(lambda _m, args: (args[0].contiguous(),))
        self.names = [f"a{i}" for i in range(len(adapter_dirs))]
        peft_model = PeftModel.from_pretrained(model, adapter_dirs[0], adapter_name="a0")
        for name, adapter_dir in zip(self.names[1:], adapter_dirs[1:], strict=True):
            peft_model.load_adapter(adapter_dir, adapter_name=name)
        peft_model.to(self.device)
        peft_model.eval()
        self.model: Any = peft_model
        self.vocab_size = int(model.config.vocab_size)

    def step(self, shape: StepShape, seq_slots: Sequence[int] | None) -> Callable[[], object]:
        names = None if seq_slots is None else [self.names[s] for s in seq_slots]
        if shape.tokens_per_seq > 1:
            ids = token_ids(shape, self.vocab_size).to(self.device)
            return lambda: self._forward(ids, names, None, use_cache=False)
        from transformers import DynamicCache

        context_shape = StepShape(shape.batch_size, shape.context_tokens, 0)
        context = token_ids(context_shape, self.vocab_size).to(self.device)
        cache = DynamicCache()
        self._forward(context, names, cache, use_cache=True)
        next_ids = context[:, -1:].contiguous()

        def decode() -> object:
            out = self._forward(next_ids, names, cache, use_cache=True)
            cache.crop(-1)  # drop the step's position: every call does the same work
            return out

        return decode

    @torch.inference_mode()
    def _forward(
        self, ids: torch.Tensor, names: list[str] | None, cache: Any, *, use_cache: bool
    ) -> object:
        kwargs = {"input_ids": ids, "cache": cache, "use_cache": use_cache, "logits_to_keep": 1}
        if names is None:
            with self.model.disable_adapter():
                return self.model(**kwargs).logits
        return self.model(**kwargs, adapter_names=names).logits
