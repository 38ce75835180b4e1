"""The runner puts each adapter's chunks side by side (base-only last) and every request still
gets what it would get alone."""

from __future__ import annotations

import threading

import pytest
import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.demo.manifest import DemoAssets
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.kv.paged import PagedKVCache
from loraplex.engine.runner import ModelRunner, by_slot
from loraplex.engine.step import ScheduledChunk, StepPlan, StepResult
from loraplex.model.adapter_weights import load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.lora import LoraSlotPool
from loraplex.ops import LoraBatch
from loraplex.sampling import SamplingParams


def chunk(rid: str, slot: int | None, tokens: tuple[int, ...], seq_id: int = 0) -> ScheduledChunk:
    return ScheduledChunk(rid, seq_id, 0, tokens, slot, samples=True)


def test_by_slot_is_stable_and_puts_base_last() -> None:
    plan = StepPlan(
        (chunk("a", 2, (5,)), chunk("b", None, (6,)), chunk("c", 0, (7,)), chunk("d", 2, (8,)),
         chunk("e", 0, (9,)), chunk("f", None, (10,))),
        ("gone",),
    )  # fmt: skip
    ordered = by_slot(plan)
    assert [c.request_id for c in ordered.chunks] == ["c", "e", "a", "d", "b", "f"]
    assert ordered.preempted == ("gone",)
    already = StepPlan(ordered.chunks, ())
    assert by_slot(already) is already  # nothing to move: the same plan


class SlotSpy:
    """The pool, recording the token slots each forward hands it."""

    def __init__(self, pool: LoraSlotPool) -> None:
        self.pool = pool
        self.seen: list[list[int]] = []

    @property
    def last_strategy(self) -> str:
        return self.pool.last_strategy

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        self.seen.append(token_slots.tolist())
        return self.pool.prepare(token_slots)

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        return self.pool.apply(layer, module, x, out, batch)


def make_runner(demo_assets: DemoAssets) -> tuple[ModelRunner, SlotSpy]:
    model_dir = demo_assets.base_model_dir
    spec = BaseModelSpec.from_dir(model_dir)
    model = load_checkpoint(model_dir)
    kv = PagedKVCache(model.attention_shape, BlockManager(64, 16), dtype=model.dtype,
                      device=model.device)  # fmt: skip
    adapters = [a for a in demo_assets.adapters if a.rank <= 64][:3]
    pool = LoraSlotPool(spec, 3, 64, dtype=model.dtype, device=model.device)
    for slot, adapter in enumerate(adapters):
        validated = validate_adapter_dir(adapter.path, spec, 64)
        pool.load(slot, load_adapter_weights(validated, dtype=model.dtype))
    spy = SlotSpy(pool)
    # The runner type-checks against LoraApplier, a protocol the spy satisfies.
    return ModelRunner(model, kv, spy, threading.Lock()), spy


def test_scrambled_chunks_sample_what_each_request_samples_alone(
    demo_assets: DemoAssets,
) -> None:
    runner, spy = make_runner(demo_assets)
    prompts = {"a": (5, 9, 14), "b": (7, 3), "c": (11, 4, 8, 2), "d": (6,), "e": (12, 13)}
    slots = {"a": 2, "b": None, "c": 0, "d": 2, "e": 1}
    params = {rid: SamplingParams(max_tokens=1, logprobs=3) for rid in prompts}
    seqs = {rid: runner.kv.allocate() for rid in prompts}
    for rid, seq in seqs.items():
        runner.kv.blocks.grow(seq, len(prompts[rid]))
    plan = StepPlan(tuple(chunk(rid, slots[rid], prompts[rid], seqs[rid]) for rid in prompts), ())
    together = runner.run(plan, params)
    # token slots reached the pool grouped by slot, base-only last
    assert spy.seen[-1] == [0] * 4 + [1] * 2 + [2] * 3 + [2] + [-1] * 2
    assert not together.failed
    for rid, prompt in prompts.items():
        alone = run_alone(runner, rid, slots[rid], prompt, params[rid])
        assert together.sampled[rid] == alone.sampled[rid]
        got, want = together.logprobs[rid].top, alone.logprobs[rid].top
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-4)
    # the comparison can fail: an adapter moves this prompt's logprobs away from the base's
    base = run_alone(runner, "c", None, prompts["c"], params["c"]).logprobs["c"]
    assert abs(base.top[0][1] - together.logprobs["c"].top[0][1]) > 1e-3


def run_alone(
    runner: ModelRunner, rid: str, slot: int | None, prompt: tuple[int, ...], params: SamplingParams
) -> StepResult:
    seq = runner.kv.allocate()
    runner.kv.blocks.grow(seq, len(prompt))
    return runner.run(StepPlan((chunk(rid, slot, prompt, seq),), ()), {rid: params})
