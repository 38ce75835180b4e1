"""What ``bench modes`` runs on: a random model of a demo preset's shapes with 16 random adapters
(ranks 8-64, every target module) in one slot pool, decode steps over it, and the greedy probes
that fail the bench when a mode changes a continuation beyond the parity rule
(bench/modes/parity.py: float32 exact, 16-bit dtypes a near-tie only)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.bench.adapters import write_random_adapter, write_random_base
from loraplex.bench.modes.parity import ParityReport, StepTop, step_tops
from loraplex.dtypes import check_dtype, torch_dtype
from loraplex.model.adapter_weights import load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.layers import resolve_linear_kernel
from loraplex.model.llama import ForwardBatch, LlamaModel, LoraApplier
from loraplex.model.lora import LoraSlotPool
from loraplex.model.merge import (
    MergedLoraApplier,
    WeightMerger,
    negated,
    negative_pool_for,
    slot_weights,
)
from loraplex.model.staged_merge import MergeStaging
from loraplex.ops import ArenaLayout, LoraBackend, LoraBatch, ModuleLoraWeights, get_backend
from loraplex.ops.plan import (
    FLOAT32_MAX_TOKENS,
    active_slot_tokens,
    check_token_slots,
    float32_pass_batch,
    none_batch,
)
from loraplex.ops.torch_ops import apply_batch

NUM_ADAPTERS = 16
RANKS = (8, 16, 32, 64)
HOT = 0  # the hot revision's slot (its rank: ModesBenchConfig.hot_rank)


def slot_rank(slot: int, hot_rank: int) -> int:
    """Slot ``slot``'s rank: the 16 slots cycle through RANKS (four of each) starting at
    ``hot_rank`` for the hot slot, so every run has the same rank mix whichever the hot one."""
    return RANKS[(RANKS.index(hot_rank) + slot) % len(RANKS)]


@dataclass(frozen=True)
class ModesBenchConfig:
    """What one run measures."""

    preset: str = "small"  # demo preset whose shapes the random model has
    dtype: str = "float32"  # model, KV and adapter dtype (loraplex.dtypes)
    batch_size: int = 16  # sequences per decode step
    context_tokens: int = 64  # prefilled tokens per sequence
    rounds: int = 7  # interleaved timing rounds
    calls_per_round: int = 5  # steps per round and variant
    num_transitions: int = 10  # merge/unmerge pairs timed
    probe_tokens: int = 8  # greedy tokens per probe
    seed: int = 0  # weights, traces
    replay_requests: int = 64  # requests per request-level replay (bench/modes/replay.py)
    replay_rounds: int = 1  # ABBA rounds of the replay (after one warm-up pair)
    hot_rank: int = 16  # the hot revision's rank (one of RANKS; the others keep the same mix)
    single_rounds: int = 15  # ABBA rounds of the single-revision trio (paired ratios per round)
    sample_ms: float = 150.0  # least duration of each single-revision timed sample
    single_blocks: int = 9  # blocks per sample; a sample is its median block (paired_rounds)
    # the base linears' and head's matmul (layers.LINEAR_KERNELS; "auto": "packed" for float32
    # on a CPU): one model, so unmerged, merged and auto all run the kernel it resolves to
    base_linear_kernel: str = "auto"

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.hot_rank not in RANKS:
            raise ValueError(f"hot_rank {self.hot_rank} is invalid; expected one of {RANKS}")
        for name in ("batch_size", "context_tokens", "rounds", "calls_per_round"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        for name in (
            "num_transitions",
            "probe_tokens",
            "replay_requests",
            "replay_rounds",
            "single_rounds",
            "single_blocks",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if not self.sample_ms > 0:  # NaN too
            raise ValueError(f"sample_ms {self.sample_ms} is invalid; expected > 0")
        try:  # an unknown name, "packed" in a 16-bit dtype, a torch without oneDNN
            resolve_linear_kernel(
                self.base_linear_kernel, torch_dtype(self.dtype), torch.device("cpu")
            )
        except ValueError as exc:
            raise ValueError(f"base_linear_kernel: {exc}") from exc


class Setup:
    """The model, a pool with every adapter, and a merged applier for the hot revision."""

    def __init__(self, root: Path, config: ModesBenchConfig) -> None:
        model_dir = write_random_base(root / "base", config.preset, config.seed)
        spec = BaseModelSpec.from_dir(model_dir)
        dtype = torch_dtype(config.dtype)
        self.model: LlamaModel = load_checkpoint(
            model_dir, dtype=dtype, linear_kernel=config.base_linear_kernel
        )
        self.pool = LoraSlotPool(
            spec, NUM_ADAPTERS, max(RANKS), dtype=dtype, device=torch.device("cpu")
        )
        for i in range(NUM_ADAPTERS):
            path = write_random_adapter(
                spec,
                model_dir,
                root / f"a{i}",
                rank=slot_rank(i, config.hot_rank),
                target_modules=TARGET_MODULES,
                seed=config.seed + i,
            )
            validated = validate_adapter_dir(path, spec, max(RANKS))
            self.pool.load(i, load_adapter_weights(validated, dtype=dtype))
        self.merger = WeightMerger(self.model)
        self.negative = negative_pool_for(self.pool)
        self.config = config

    def merge(self, slot: int) -> MergedLoraApplier:
        """``slot``'s adapter merged at once (staged whole, then committed)."""
        staging = self.begin_merge(slot)
        staging.advance(math.inf)
        return self.commit(staging, slot)

    def begin_merge(self, slot: int) -> MergeStaging:
        """A staged merge of ``slot``'s adapter (``advance`` it, then :meth:`commit`)."""
        weights = slot_weights(self.pool, slot)
        self.negative.load(0, negated(weights))
        return self.merger.stage(weights)

    def commit(self, staging: MergeStaging, slot: int) -> MergedLoraApplier:
        self.merger.commit(staging)
        return MergedLoraApplier(self.pool, slot, self.negative)

    def abandon(self, staging: MergeStaging) -> None:
        staging.abandon()
        self.negative.clear(0)

    def unmerge(self, *, release_now: bool = True) -> None:
        """``release_now`` False: the merged weights' arena is left to ``merger.releases`` (the
        caller frees it, as the engine does by pieces between steps)."""
        self.merger.unmerge(release_now=release_now)
        self.negative.clear(0)


class GroupedFloat32:
    """``grouped`` with its float32 pass forced on every step it can take (16-bit weights on a
    CPU, two runs or more: the runs of at most ``max_run`` tokens in float32, as ``auto``'s
    pass), whatever :class:`~loraplex.ops.AutoPolicy` thinks of it: the one computation the
    unmerged op runs that no registered backend forces, so the bench's strategy check can time
    it against ``auto`` (docs/modes.md, "Twenty-second pass")."""

    name = "grouped_float32"

    def __init__(self, max_run: int = FLOAT32_MAX_TOKENS) -> None:
        self.max_run = max_run

    def prepare(self, token_slots: torch.Tensor, layout: ArenaLayout) -> LoraBatch:
        check_token_slots(token_slots, len(layout.slot_rows))
        tokens = active_slot_tokens(token_slots, layout)
        if not tokens:
            return none_batch(token_slots)
        return float32_pass_batch(token_slots, layout, tokens, self.max_run)

    def apply(
        self, x: torch.Tensor, out: torch.Tensor, weights: ModuleLoraWeights, batch: LoraBatch
    ) -> torch.Tensor:
        return apply_batch(x, out, weights, batch)


def ran_as(batch: LoraBatch) -> str:
    """The forced strategy a batch's computation is: its strategy, ``grouped_float32`` for
    grouped through the float32 pass."""
    return "grouped_float32" if batch.float32 else batch.strategy.value


class BackendView:
    """``pool`` computed by another backend (a registered name: ``masked``, ``grouped``,
    ``batched``, ``auto``; or an instance: :class:`GroupedFloat32`): the same weights and
    slots, for timing the strategies against each other on one batch."""

    def __init__(self, pool: LoraSlotPool, backend: str | LoraBackend) -> None:
        self.pool = pool
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.last_strategy = "none"  # the last batch's strategy
        self.last_ran_as = "none"  # the last batch's forced-strategy name (ran_as)

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        batch = self.backend.prepare(
            token_slots.to(self.pool.device, torch.int64), self.pool.layout
        )
        self.last_strategy, self.last_ran_as = batch.strategy.value, ran_as(batch)
        return batch

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        if not self.pool.targets(layer, module):
            return out
        return self.backend.apply(x, out, self.pool.module_weights(layer, module), batch)


def decode_step(setup: Setup, slots: list[int | None]) -> Callable[[LoraApplier | None], None]:
    """A function running one decode step of ``len(slots)`` sequences with a given applier."""
    n, ctx = len(slots), setup.config.context_tokens
    model = setup.model
    kv = ContiguousKVCache(
        model.attention_shape, n, ctx + 1, dtype=model.dtype, device=model.device
    )
    seqs = [kv.allocate() for _ in range(n)]
    gen = torch.Generator().manual_seed(setup.config.seed)
    prompt = torch.randint(3, model.config.vocab_size, (n * ctx,), generator=gen)
    token_slots = [-1 if s is None else s for s in slots]
    prefill = ForwardBatch.build(
        prompt,
        [SequenceChunk(s, 0, ctx) for s in seqs],
        token_slots=[t for t in token_slots for _ in range(ctx)],
    )
    model.forward_batch(prefill, kv, setup.pool)
    step = ForwardBatch.build(
        prompt[:n], [SequenceChunk(s, ctx, 1) for s in seqs], token_slots=token_slots
    )

    def run(lora: LoraApplier | None) -> None:
        model.forward_batch(step, kv, lora)  # rewrites the same KV row: a steady decode step

    return run


def prefill_step(setup: Setup, slots: list[int | None]) -> Callable[[LoraApplier | None], None]:
    """A function running one prefill step: every sequence's ``context_tokens`` prompt tokens
    (``len(slots) * context_tokens`` tokens, one revision per sequence) in one forward."""
    n, ctx = len(slots), setup.config.context_tokens
    model = setup.model
    kv = ContiguousKVCache(model.attention_shape, n, ctx, dtype=model.dtype, device=model.device)
    seqs = [kv.allocate() for _ in range(n)]
    gen = torch.Generator().manual_seed(setup.config.seed + 1)
    prompt = torch.randint(3, model.config.vocab_size, (n * ctx,), generator=gen)
    token_slots = [-1 if s is None else s for s in slots]
    batch = ForwardBatch.build(
        prompt,
        [SequenceChunk(s, 0, ctx) for s in seqs],
        token_slots=[t for t in token_slots for _ in range(ctx)],
    )

    def run(lora: LoraApplier | None) -> None:
        model.forward_batch(batch, kv, lora)  # rewrites the same KV rows: a steady prefill

    return run


def greedy(setup: Setup, slot: int | None, lora: LoraApplier, num_tokens: int) -> list[StepTop]:
    """``num_tokens`` greedy tokens of slot ``slot``'s probe prompt, each with its top logprobs."""
    model = setup.model
    prompt = [5 + (slot or 0), 17, 42, 8, 99, 3]
    kv = ContiguousKVCache(
        model.attention_shape, 1, len(prompt) + num_tokens, dtype=model.dtype, device=model.device
    )
    seq, tokens, start = kv.allocate(), list(prompt), 0
    out: list[StepTop] = []
    for _ in range(num_tokens):
        chunk = SequenceChunk(seq, start, len(tokens) - start)
        slots = [-1 if slot is None else slot] * chunk.num_tokens
        batch = ForwardBatch.build(tokens[start:], [chunk], token_slots=slots)
        start = len(tokens)
        out.append(step_tops(model.forward_batch(batch, kv, lora)[-1:])[0])
        tokens.append(out[-1].token)
    return out


def probes(setup: Setup, report: ParityReport) -> None:
    """Every adapter and the base model: unmerged against merged itself and against another
    revision merged (the negative pass), each judged by ``report``'s rule."""
    n = setup.config.probe_tokens
    for slot in [None, *range(NUM_ADAPTERS)]:
        want = greedy(setup, slot, setup.pool, n)
        others = [s for s in (HOT, 1) if s != slot][:1]
        for merged in ([slot] if slot is not None else []) + others:
            applier = setup.merge(merged)
            try:
                got = greedy(setup, slot, applier, n)
            finally:
                setup.unmerge()
            report.check(f"probe of slot {slot} with slot {merged} merged", want, got)
