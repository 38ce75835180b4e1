"""A penalized request's sampling reads its history once, then only its new tokens
(``PenaltyCounts``): the penalties read the whole prompt and output on every step, on the engine
thread every tenant shares, so a tenant's per-token cost grew with its context
(docs/benchmarks/attack28.md)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, SupportsIndex, overload

import pytest
import torch

from loraplex.demo.manifest import DemoAssets
from loraplex.engine.runner import PENALTY_COUNTS_IDLE_STEPS
from loraplex.engine.step import StepPlan
from loraplex.model.sampler import PenaltyCounts, RowHistory, process_logits
from loraplex.sampling import SamplingParams
from tests.engine.test_runner_order import chunk, make_runner

PENALIZED = SamplingParams(
    max_tokens=64, repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.4
)


class Reads:
    """How many tokens the sampler read out of a history."""

    def __init__(self) -> None:
        self.tokens = 0


class CountedPrompt(tuple[int, ...]):
    """A prompt (a tuple, as ``EngineRequest.prompt_token_ids``) that counts its tokens read."""

    reads: Reads

    def __iter__(self) -> Iterator[int]:
        self.reads.tokens += len(self)
        return super().__iter__()


class CountedOutput(list[int]):
    """An output (a list, as ``Request.output_token_ids``) that counts its tokens read."""

    reads: Reads

    def __iter__(self) -> Iterator[int]:
        self.reads.tokens += len(self)
        return super().__iter__()

    @overload
    def __getitem__(self, index: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: Any) -> Any:
        got = super().__getitem__(index)
        self.reads.tokens += len(got) if isinstance(index, slice) else 1
        return got


def test_each_step_reads_only_the_new_output_tokens(demo_assets: DemoAssets) -> None:
    runner, _ = make_runner(demo_assets)
    reads = Reads()
    prompt = CountedPrompt(random.Random(1).randrange(600) for _ in range(400))
    prompt.reads = reads
    output = CountedOutput()
    output.reads = reads
    seq = runner.kv.allocate()
    runner.kv.blocks.grow(seq, 3)
    plan = StepPlan((chunk("r", None, (5, 9, 14), seq),), ())
    steps = 40
    for _ in range(steps):
        result = runner.run(plan, {"r": PENALIZED}, histories={"r": RowHistory(prompt, output)})
        assert not result.failed
        output.append(result.sampled["r"])
    # the prompt once and each output token once; main read the prompt and the whole output on
    # every step: 40 x 400 + 780 = 16,780 tokens here
    assert reads.tokens <= len(prompt) + len(output)


def test_kept_counts_penalize_as_counts_made_afresh(demo_assets: DemoAssets) -> None:
    runner, _ = make_runner(demo_assets)
    rng = random.Random(2)
    prompt = tuple(rng.randrange(600) for _ in range(50))
    output: list[int] = []
    seq = runner.kv.allocate()
    runner.kv.blocks.grow(seq, 3)
    plan = StepPlan((chunk("r", None, (5, 9, 14), seq),), ())
    logits = torch.randn(600)
    for step in range(30):
        history = RowHistory(prompt, output)
        runner.run(plan, {"r": PENALIZED}, histories={"r": history})
        kept = runner._penalties["r"][0]
        assert kept.num_output == len(output)
        fresh = process_logits(logits, PENALIZED, history)
        assert torch.equal(process_logits(logits, PENALIZED, kept), fresh)
        output.extend(rng.randrange(600) for _ in range(step % 3))  # 0 to 2 tokens a step


def test_counts_follow_a_history_they_cannot_extend() -> None:
    device = torch.device("cpu")
    counts = PenaltyCounts.of(RowHistory((1, 2), [3, 3, 4]), 8, device)
    shorter = counts.advance(RowHistory(counts.prompt, [5]))  # not a continuation: afresh
    assert shorter.counts.tolist() == [0, 0, 0, 0, 0, 1, 0, 0]
    other = shorter.advance(RowHistory((6,), [5]))  # another prompt: afresh
    assert other.in_prompt.tolist() == [False] * 6 + [True, False]
    grown = other.advance(RowHistory(other.prompt, [5, 7, 7]))  # grown: the new tokens only
    assert grown is other
    assert grown.counts.tolist() == [0, 0, 0, 0, 0, 1, 0, 2]


def test_counts_go_with_their_request_or_when_unread(demo_assets: DemoAssets) -> None:
    runner, _ = make_runner(demo_assets)
    seqs = {rid: runner.kv.allocate() for rid in ("a", "b")}
    for seq in seqs.values():
        runner.kv.blocks.grow(seq, 3)

    def step(*rids: str) -> None:
        plan = StepPlan(tuple(chunk(r, None, (5, 9, 14), seqs[r]) for r in rids), ())
        histories = {r: RowHistory((1, 2, 3), []) for r in rids}
        runner.run(plan, dict.fromkeys(rids, PENALIZED), histories=histories)

    step("a", "b")
    runner.drop("a")
    assert set(runner._penalties) == {"b"}
    for _ in range(PENALTY_COUNTS_IDLE_STEPS - 1):
        step("a")
    assert set(runner._penalties) == {"a", "b"}  # b unread for fewer steps than the limit
    step("a")
    assert set(runner._penalties) == {"a"}


@pytest.mark.parametrize("vocab", [8, 600])
def test_counts_of_a_history_equal_the_penalties_definition(vocab: int) -> None:
    rng = random.Random(vocab)
    prompt = tuple(rng.randrange(vocab) for _ in range(20))
    output = [rng.randrange(vocab) for _ in range(30)]
    counts = PenaltyCounts.of(RowHistory(prompt, output[:10]), vocab, torch.device("cpu"))
    counts = counts.advance(RowHistory(prompt, output))
    want = torch.bincount(torch.tensor(output), minlength=vocab).float()
    assert torch.equal(counts.counts, want)
    assert counts.in_prompt.tolist() == [t in prompt for t in range(vocab)]
