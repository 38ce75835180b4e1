"""``sim.step_cost``: a step plan's price as the cost model's formula states it."""

from __future__ import annotations

import math

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import Request
from loraplex.engine.step import ScheduledChunk, StepPlan
from loraplex.residency.pipeline import Footprint
from loraplex.sampling import SamplingParams
from loraplex.sim.cost_model import StepCost
from loraplex.sim.run import adapter_key
from loraplex.sim.step_cost import adapter_shapes, step_seconds

A, B = adapter_key("t", "a"), adapter_key("t", "b")
SHAPES = adapter_shapes({A: Footprint(1, 640, 640), B: Footprint(1, 300, 300)}, {A: 64, B: 8})


def _request(request_id: str, key: AdapterKey | None, prompt: int, outputs: int) -> Request:
    engine = EngineRequest(
        request_id=request_id,
        tenant="t",
        adapter_key=key,
        prompt_token_ids=(1,) * prompt,
        params=SamplingParams(max_tokens=8),
    )
    return Request(engine, 0.0, 30.0, output_token_ids=[1] * outputs)


def _chunk(request_id: str, start: int, num: int) -> ScheduledChunk:
    return ScheduledChunk(request_id, 0, start, (1,) * num, None, True)


# A decodes (one token past its 4-token prompt), B prefills 3 tokens, C (base model) decodes.
REQUESTS = {
    "a": _request("a", A, 4, 1),
    "b": _request("b", B, 3, 0),
    "c": _request("c", None, 2, 1),
}
PLAN = StepPlan((_chunk("a", 4, 1), _chunk("b", 0, 3), _chunk("c", 2, 1)), ())


def test_shapes_hold_rank_bytes_and_bytes_per_rank() -> None:
    assert SHAPES[A] == (64, 640, 10.0)
    assert SHAPES[B] == (8, 300, 37.5)


def test_an_older_model_prices_tokens_revisions_and_ranks() -> None:
    cost = StepCost(step_fixed_s=1.0, per_token_s=10.0, per_revision_s=100.0,
                    per_rank_token_s=1000.0, per_prefill_token_s=10000.0)  # fmt: skip
    # 2 decode tokens, 3 prefill, 2 revisions, rank tokens 64 + 3 * 8
    expected = 1.0 + 10.0 * 2 + 10000.0 * 3 + 100.0 * 2 + 1000.0 * (64 + 24)
    assert step_seconds(PLAN, REQUESTS, SHAPES, cost) == expected


def test_a_weights_model_adds_byte_tokens_and_revision_widths() -> None:
    cost = StepCost(0.0, 0.0, 0.0, 0.0, per_byte_token_s=1.0, per_revision_width_s=1000.0)
    expected = (640 + 3 * 300) + 1000.0 * math.fsum((10.0, 37.5))
    assert step_seconds(PLAN, REQUESTS, SHAPES, cost) == expected
    # one revision: its width as is
    lone = StepPlan((_chunk("a", 4, 1),), ())
    assert step_seconds(lone, REQUESTS, SHAPES, cost) == 640 + 1000.0 * 10.0


def test_a_merged_revision_runs_as_base_and_every_other_token_pays_its_negative_pass() -> None:
    cost = StepCost(step_fixed_s=1.0, per_token_s=10.0, per_revision_s=100.0,
                    per_rank_token_s=1000.0, per_prefill_token_s=10000.0)  # fmt: skip
    # A merged (rank 64): its decode token has no LoRA terms; B's 3 tokens and C's 1 pay A's
    # rank once more, and A counts as a revision of the step (the negative pass)
    expected = 1.0 + 10.0 * 2 + 10000.0 * 3 + 100.0 * 2 + 1000.0 * (24 + 4 * 64)
    assert step_seconds(PLAN, REQUESTS, SHAPES, cost, merged=A) == expected
    # only the merged revision's tokens in the step: no LoRA work at all
    alone = StepPlan((_chunk("a", 4, 1),), ())
    assert step_seconds(alone, REQUESTS, SHAPES, cost, merged=A) == 1.0 + 10.0
    assert step_seconds(alone, REQUESTS, SHAPES, cost) == 1.0 + 10.0 + 100.0 + 1000.0 * 64
