"""The Llama-family decoder (Llama, Mistral, Qwen2 weight layouts) over a flattened token batch.

One forward takes the new tokens of many sequences concatenated (``[num_tokens]``, prefill and
decode mixed), their positions and LoRA slots, and returns logits for the tokens asked for.
Module and parameter names mirror Hugging Face checkpoints (``model.layers.3.mlp.up_proj.weight``)
so ``checkpoint.load_checkpoint`` fills them by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.devices import memory_total_bytes
from loraplex.model.config import ModelConfig
from loraplex.model.kv_cache import AttentionShape, KVCache, SequenceChunk
from loraplex.model.layers import (
    Embedding,
    Linear,
    LinearFn,
    PackedLinear,
    RMSNorm,
    linear_fn,
    resolve_linear_kernel,
)
from loraplex.model.rope import RopeTables, RotaryEmbedding, apply_rope
from loraplex.ops.base import LoraBatch

PlanT = TypeVar("PlanT")


class LoraApplier(Protocol):
    """What the decoder needs from a LoRA slot pool (``loraplex.model.lora.LoraSlotPool``)."""

    @property
    def last_strategy(self) -> str:
        """The strategy (``ops.base.Strategy`` value) of the last ``prepare``: what traces
        report."""

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch: ...

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class LoraStep:
    """The pool and this forward's LoRA metadata, handed to every layer."""

    pool: LoraApplier  # slot pool holding the adapters' weights
    batch: LoraBatch  # per-token slots and precomputed metadata for this forward


@dataclass(frozen=True)
class ForwardBatch:
    """The tokens of one forward, flattened. Build it with ``ForwardBatch.build``."""

    token_ids: torch.Tensor  # [num_tokens] int64, chunk after chunk
    positions: torch.Tensor  # [num_tokens] int64 position of each token in its sequence
    seq_lens: torch.Tensor  # [num_tokens] int64 length of each token's sequence after this forward
    chunks: tuple[SequenceChunk, ...]  # which sequence each run of tokens belongs to
    token_slots: torch.Tensor | None  # [num_tokens] int64 LoRA slot, -1 = base; None = no LoRA
    logits_indices: torch.Tensor  # [num_logits] int64 tokens whose logits are returned

    @classmethod
    def build(
        cls,
        token_ids: Sequence[int] | torch.Tensor,
        chunks: Sequence[SequenceChunk],
        *,
        token_slots: Sequence[int] | torch.Tensor | None = None,
        all_logits: bool | Sequence[bool] = False,
        device: torch.device | None = None,
    ) -> ForwardBatch:
        """Derive positions from the chunks; logits for each chunk's last token, or for every
        token of every chunk (``all_logits=True``) or of the chunks flagged in ``all_logits``
        (one flag per chunk: only those pay for the wider LM head)."""
        # NOTE: positions and indices are built as Python lists and converted once each: a
        # few tensor ops per chunk would cost more than a decode step's attention.
        ids = torch.as_tensor(token_ids, dtype=torch.int64)
        counts = [c.num_tokens for c in chunks]
        ends = list(accumulate(counts))
        if (ends[-1] if ends else 0) != ids.numel():
            raise ValueError(
                f"token_ids has {ids.numel()} tokens; expected {sum(counts)} (the chunks)"
            )
        positions = [p for c in chunks for p in range(c.start_pos, c.start_pos + c.num_tokens)]
        seq_lens = [c.start_pos + c.num_tokens for c in chunks for _ in range(c.num_tokens)]
        logits_indices = _logits_indices(all_logits, counts, ends)
        slots = None
        if token_slots is not None:
            slots = torch.as_tensor(token_slots, dtype=torch.int64).to(device)
            if slots.numel() != ids.numel():
                raise ValueError(f"token_slots has {slots.numel()} entries; expected {ids.numel()}")
        return cls(
            token_ids=ids.to(device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
            chunks=tuple(chunks),
            token_slots=slots,
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=device),
        )


def _logits_indices(
    all_logits: bool | Sequence[bool], counts: Sequence[int], ends: Sequence[int]
) -> list[int]:
    if isinstance(all_logits, bool):
        return list(range(ends[-1] if ends else 0)) if all_logits else [end - 1 for end in ends]
    if len(all_logits) != len(counts):
        raise ValueError(
            f"all_logits has {len(all_logits)} flags; expected one per chunk ({len(counts)})"
        )
    out: list[int] = []
    for every, count, end in zip(all_logits, counts, ends, strict=True):
        out.extend(range(end - count, end) if every else (end - 1,))
    return out


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        hidden, bias = cfg.hidden_size, cfg.qkv_bias
        q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = Linear(hidden, q_width, bias, dtype=dtype, device=device)
        self.k_proj = Linear(hidden, kv_width, bias, dtype=dtype, device=device)
        self.v_proj = Linear(hidden, kv_width, bias, dtype=dtype, device=device)
        self.o_proj = Linear(q_width, hidden, cfg.o_bias, dtype=dtype, device=device)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        hidden, inner, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = Linear(hidden, inner, bias, dtype=dtype, device=device)
        self.up_proj = Linear(hidden, inner, bias, dtype=dtype, device=device)
        self.down_proj = Linear(inner, hidden, bias, dtype=dtype, device=device)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        index: int,
        linear: LinearFn,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.index = index
        self.cfg = cfg
        # F.linear, layers.onednn_linear or the model's layers.PackedLinear (linear_kernel)
        self.run_linear = linear
        self.self_attn = Attention(cfg, dtype=dtype, device=device)
        self.mlp = MLP(cfg, dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device
        )
        self.post_attention_layernorm = RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device
        )

    def _proj(
        self, module: str, linear: Linear, x: torch.Tensor, lora: LoraStep | None
    ) -> torch.Tensor:
        out = self.run_linear(x, linear.weight, linear.bias)
        if lora is None:
            return out
        return lora.pool.apply(self.index, module, x, out, lora.batch)

    def forward_tokens(
        self,
        h: torch.Tensor,
        rope: RopeTables,
        kv: KVCache[PlanT],
        plan: PlanT,
        lora: LoraStep | None,
    ) -> torch.Tensor:
        attn, mlp, cfg = self.self_attn, self.mlp, self.cfg
        num_tokens = h.shape[0]
        x = self.input_layernorm(h)
        q = self._proj("q_proj", attn.q_proj, x, lora).view(num_tokens, cfg.num_heads, -1)
        k = self._proj("k_proj", attn.k_proj, x, lora).view(num_tokens, cfg.num_kv_heads, -1)
        v = self._proj("v_proj", attn.v_proj, x, lora).view(num_tokens, cfg.num_kv_heads, -1)
        out = kv.attend(self.index, apply_rope(q, rope), apply_rope(k, rope), v, plan)
        h = h + self._proj("o_proj", attn.o_proj, out, lora)
        x = self.post_attention_layernorm(h)
        gate = self._proj("gate_proj", mlp.gate_proj, x, lora)
        up = self._proj("up_proj", mlp.up_proj, x, lora)
        return h + self._proj("down_proj", mlp.down_proj, F.silu(gate) * up, lora)


def layer_linears(layer: nn.Module) -> tuple[Linear, ...]:
    """A decoder layer's seven projections."""
    attn, mlp = cast(DecoderLayer, layer).self_attn, cast(DecoderLayer, layer).mlp
    attention = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    return (*attention, mlp.gate_proj, mlp.up_proj, mlp.down_proj)


class Backbone(nn.Module):
    """``model.*`` of a checkpoint: embeddings, decoder layers, final norm."""

    def __init__(
        self, cfg: ModelConfig, linear: LinearFn, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, linear, dtype=dtype, device=device) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)


def packable_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of the weights the "packed" kernel copies (every decoder layer's seven projections
    and the head), from the config alone: what ``LlamaModel.packed_bytes`` reads once packed."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    elements = cfg.num_layers * per_layer + cfg.vocab_size * h
    return elements * torch.empty((), dtype=dtype).element_size()


class LlamaModel(nn.Module):
    """Decoder + LM head. Weights are uninitialised until ``checkpoint.load_checkpoint``.
    ``linear_kernel`` (a ``layers.LINEAR_KERNELS`` entry) picks the matmul every base linear
    layer and the head run; ``self.linear_kernel`` is the one chosen ("blas", "onednn" or
    "packed")."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        dtype: torch.dtype,
        device: torch.device,
        linear_kernel: str = "auto",
    ) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.device = device
        self.linear_kernel = resolve_linear_kernel(
            linear_kernel,
            dtype,
            device,
            packed_bytes=packable_bytes(cfg, dtype),
            memory_bytes=memory_total_bytes(),
        )
        self._linear = linear_fn(self.linear_kernel)
        self.model = Backbone(cfg, self._linear, dtype=dtype, device=device)
        # Tied: the head reads the embedding matrix; no separate parameter exists.
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, False, dtype=dtype, device=device)
        )
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, cfg.max_position_embeddings, device)

    def prepack(self) -> int:
        """With the "packed" kernel, pack every base linear's weight and the head that has no
        current packed copy (``load_checkpoint`` does at load, the engine on a thread of its
        own, a merge for what it wrote); returns how many it packed (0 with another kernel).
        Until a weight is packed its layer runs oneDNN on the dense weight, same results."""
        if not isinstance(self._linear, PackedLinear):
            return 0
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        weights = [m.weight for layer in self.model.layers for m in layer_linears(layer)]
        return sum(self._linear.pack(weight) for weight in [*weights, head])

    def pack(self, weight: torch.Tensor) -> bool:
        """With the "packed" kernel, make ``weight``'s packed copy (a staged merge's new weight,
        before it is swapped in); returns whether one was made (False with another kernel)."""
        return isinstance(self._linear, PackedLinear) and self._linear.pack(weight)

    def packed_bytes(self) -> int:
        """Bytes of the packed copies of the base weights held now (0 with a kernel other than
        "packed"): memory beside ``weight_bytes``, not part of it."""
        return self._linear.nbytes() if isinstance(self._linear, PackedLinear) else 0

    def weight_bytes(self) -> int:
        """Bytes of the model's parameters (the dense weights: embeddings, linears, norms)."""
        return sum(p.nbytes for p in self.parameters())

    @property
    def attention_shape(self) -> AttentionShape:
        cfg = self.config
        return AttentionShape(
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            sliding_windows=cfg.sliding_windows,
        )

    @torch.inference_mode()
    def forward_batch(
        self, batch: ForwardBatch, kv: KVCache[PlanT], lora: LoraApplier | None = None
    ) -> torch.Tensor:
        """Run the batch, storing its keys/values in ``kv``; returns logits [num_logits, vocab]
        in the model dtype. ``lora`` applies when the batch carries ``token_slots``."""
        step = None
        if lora is not None and batch.token_slots is not None:
            prepared = lora.prepare(batch.token_slots)
            # no token needs LoRA work (all base-model tokens, or all the merged
            # revision's): the layers run as the base model's, with no per-module calls
            if not prepared.adds_nothing:
                step = LoraStep(pool=lora, batch=prepared)
        plan = kv.plan(batch.chunks)
        rope = self.rotary.tables(batch.positions, batch.seq_lens, self.dtype)
        h = self.model.embed_tokens(batch.token_ids)
        for layer in self.model.layers:
            h = cast(DecoderLayer, layer).forward_tokens(h, rope, kv, plan, step)
        h = self.model.norm(h.index_select(0, batch.logits_indices))
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return self._linear(h, head, None)
