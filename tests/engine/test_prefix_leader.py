"""``EngineRequest.prefix_leader`` (n > 1): followers wait for the leader's prompt to be cached,
then compute only what its full blocks do not cover; without a live leader they run at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loraplex.demo.assets import DemoAssets
from loraplex.engine.core import EngineCore
from loraplex.engine.offline import OfflineConfig, OfflineEngine
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.step import ScheduledChunk, StepPlan
from loraplex.sampling import SamplingParams

BLOCK = 4
PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


@pytest.fixture
def core(demo_assets: DemoAssets) -> Iterator[EngineCore]:
    config = OfflineConfig(block_size=BLOCK, max_num_seqs=8)
    with OfflineEngine(demo_assets.base_model_dir, config) as offline:
        yield offline.core


def request(rid: str, prompt: tuple[int, ...], leader: str | None = None) -> EngineRequest:
    return EngineRequest(rid, "t", None, prompt, PARAMS, prefix_leader=leader)


def run(
    core: EngineCore, requests: list[EngineRequest], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[StepPlan], dict[str, list[TokenDelta]]]:
    """Add ``requests`` and step until all finish; every plan (``schedule``'s, and the steady
    decode steps' ``schedule_decodes`` made) and each request's deltas."""
    plans: list[StepPlan] = []
    schedule, schedule_decodes = core.scheduler.schedule, core.scheduler.schedule_decodes

    def spy() -> StepPlan:
        plans.append(schedule())
        return plans[-1]

    def decodes_spy() -> StepPlan | None:
        plan = schedule_decodes()
        if plan is not None:
            plans.append(plan)
        return plan

    monkeypatch.setattr(core.scheduler, "schedule", spy)
    monkeypatch.setattr(core.scheduler, "schedule_decodes", decodes_spy)
    deltas: dict[str, list[TokenDelta]] = {r.request_id: [] for r in requests}
    for r in requests:
        core.add(r, deltas[r.request_id].append)  # type: ignore[arg-type]
    while core.scheduler.requests:
        core.step()
    core.scheduler.blocks.check_integrity()
    return plans, deltas


def chunks_of(plans: list[StepPlan], rid: str) -> list[tuple[int, ScheduledChunk]]:
    return [(i, c) for i, p in enumerate(plans) for c in p.chunks if c.request_id == rid]


def test_followers_wait_for_the_leader_then_compute_only_the_partial_block(
    core: EngineCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = tuple(range(10, 32))  # 22 tokens: 5 full blocks reusable, 2 tokens left
    requests = [
        request("lead", prompt),
        request("f1", prompt, "lead"),
        request("f2", prompt, "lead"),
    ]
    plans, deltas = run(core, requests, monkeypatch)
    (lead_step, lead_first), *_ = chunks_of(plans, "lead")
    assert (lead_first.start_pos, len(lead_first.token_ids)) == (0, 22)
    for rid in ("f1", "f2"):
        (step, first), *_ = chunks_of(plans, rid)
        assert step > lead_step  # not in the leader's prefill step
        assert (first.start_pos, first.token_ids) == (20, prompt[20:])
        # Greedy over the same cached prompt: the same continuation as the leader's.
        assert [d.token_ids for d in deltas[rid]] == [d.token_ids for d in deltas["lead"]]
    computed = sum(len(c.token_ids) for p in plans for c in p.chunks)
    assert computed == 22 + 2 * 2 + 3 * 2  # prompts, then two decodes each


def test_followers_without_a_live_leader_run_at_once(
    core: EngineCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = tuple(range(40, 58))
    requests = [request("orphan", prompt, "never-added"), request("other", prompt[::-1])]
    plans, _ = run(core, requests, monkeypatch)
    assert {c.request_id for c in plans[0].chunks} == {"orphan", "other"}

    # A leader aborted before its prompt ran: the follower computes the prompt itself.
    core.add(request("gone", prompt[1:]), lambda _: None)
    follower = request("f", prompt[1:], "gone")
    core.abort("gone")
    plans, _ = run(core, [follower], monkeypatch)
    assert plans[0].chunks[0].start_pos == 0 and len(plans[0].chunks[0].token_ids) == 17
