"""The engine core keeps one record per live request, and retiring a request leaves nothing of
it behind: after mixed traffic (finishes, client aborts while queued, loading and running, a
request whose part of a step raises, a lease that fails, a queue timeout, a queue push-out,
preemptions) the core holds no record, the runner no random stream, the KV no block and the
adapter cache no lease. ``check_integrity`` runs between every two steps."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from engine_kit import GatedPipeline, gated_runtime

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import ManualClock
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.core import EngineCore
from loraplex.engine.factory import build_engine_core
from loraplex.engine.live import Live, LiveRecordError, check_records
from loraplex.engine.output import OutputTracker
from loraplex.engine.protocol import FINISH_ABORT, EngineRequest, TokenDelta
from loraplex.engine.request import Request, RequestState
from loraplex.engine.step import ScheduledChunk, StepPlan
from loraplex.errors import GenerationError, QueueFullError, QueueTimeoutError
from loraplex.residency.cache import TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.sampling import SamplingParams

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
Outputs = dict[str, list[TokenDelta | BaseException]]


@dataclasses.dataclass
class Rig:
    core: EngineCore
    cache: TieredAdapterCache
    pipeline: GatedPipeline
    clock: ManualClock
    woke: threading.Event
    out: Outputs
    preempted: list[str]

    def add(self, request: EngineRequest) -> None:
        received = self.out.setdefault(request.request_id, [])
        self.core.add(request, received.append)

    def step_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not done():
            assert time.monotonic() < deadline, "the engine did not get there"
            if not self.core.step():
                self.woke.wait(0.2)
                self.woke.clear()
            self.core.check_integrity()
            self.core.scheduler.check_integrity()  # kept KV and the blocks' own invariants

    def live(self, request_id: str) -> bool:
        return request_id in self.core.scheduler.requests


@pytest.fixture
def rig(demo_assets: DemoAssets, tmp_path: Path) -> Iterator[Rig]:
    runtime, pipeline = gated_runtime(demo_assets, tmp_path, max_loras=4)
    cache = runtime.cache
    # 16 blocks of 8 tokens: four growing sequences run out of KV and preempt each other.
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128,
                            max_queue_len=6)  # fmt: skip
    config = EngineConfig(scheduler=sched, block_size=8, num_kv_blocks=16)
    clock = ManualClock()
    core = build_engine_core(demo_assets.base_model_dir, config, runtime, clock=clock)
    woke = threading.Event()
    core.on_lease_done = woke.set
    preempted: list[str] = []
    schedule = core.scheduler.schedule

    def recording_schedule() -> StepPlan:  # the real plan, its preemptions noted
        plan = schedule()
        preempted.extend(plan.preempted)
        return plan

    core.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    yield Rig(core, cache, pipeline, clock, woke, {}, preempted)
    for gate in pipeline.gates.values():
        gate.set()
    core.close()
    cache.close()


def _request(core: EngineCore, rid: str, tenant: str, prompt: str, **kw: object) -> EngineRequest:
    ids = tuple(core.tokenizer.encode(prompt))
    params = SamplingParams(**{"max_tokens": 24, "ignore_eos": True, **kw})  # type: ignore[arg-type]
    return EngineRequest(rid, tenant, None, ids, params)


def _ending(received: list[TokenDelta | BaseException]) -> object:
    last = received[-1]
    return last if isinstance(last, BaseException) else last.finish_reason


def test_retiring_leaves_no_per_request_state(
    rig: Rig, demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    core, adapters = rig.core, demo_assets.adapters
    digest = _base_digest(demo_assets)
    keys = [a.key(digest) for a in adapters]
    # A queue push-out: a heavy tenant fills the queue, a light one's request takes a place.
    for i in range(6):
        rig.add(_request(core, f"heavy-{i}", "heavy", "The acme"))
    rig.add(_request(core, "light", "light", "The globex"))
    core.check_integrity()
    core.step()  # four start: the queue has room again
    # An adapter still loading (its gate shut), aborted by its client: its lease is orphaned.
    rig.pipeline.gates[keys[2]] = threading.Event()
    gated = dataclasses.replace(_request(core, "gated", "acme", "The acme billing team"),
                                adapter_key=keys[2])  # fmt: skip
    rig.add(gated)
    rig.step_until(lambda: core.scheduler.requests["gated"].state is RequestState.ADAPTER_WAIT)
    core.abort("gated")
    core.check_integrity()
    # A lease that fails: a revision the store does not hold.
    ghost = dataclasses.replace(keys[0], name="ghost")
    rig.add(dataclasses.replace(_request(core, "lost", "acme", "The acme"), adapter_key=ghost))
    rig.step_until(lambda: not rig.live("lost"))
    # Running traffic: adapters, traced, prompt logprobs, seeded sampling; one whose part of
    # a step raises, in the same steps as traced requests.
    real_run = core.runner.run

    def run(plan: StepPlan, params: object, *rest: object) -> object:
        if any(c.request_id == "bomb" for c in plan.chunks):
            raise RuntimeError("the bomb's part of the step")
        return real_run(plan, params, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(core.runner, "run", run)
    traced = _request(core, "traced", "globex", "The globex search team", temperature=0.8, seed=7)
    rig.add(dataclasses.replace(traced, traceparent=TRACEPARENT, adapter_key=keys[5]))
    rig.add(_request(core, "logprobs", "initech", "The initech", prompt_logprobs=2))
    quitter = _request(core, "quitter", "acme", "The acme legal", temperature=1.0, max_tokens=90)
    rig.add(dataclasses.replace(quitter, adapter_key=keys[3]))
    rig.step_until(lambda: len(rig.out["traced"]) >= 1)
    rig.add(_request(core, "bomb", "mallory", "The acme"))  # fails beside a traced request
    rig.step_until(lambda: not rig.live("bomb") and len(rig.out["quitter"]) >= 2)
    core.abort("quitter")  # a client leaving mid-stream
    # A queue timeout: added between steps, expired before it could be scheduled.
    rig.add(dataclasses.replace(_request(core, "late", "acme", "The acme"), deadline_s=1.0))
    rig.clock.advance(2.0)
    rig.step_until(lambda: not core.scheduler.requests)
    rig.pipeline.gates[keys[2]].set()  # the orphaned load completes; its lease is released
    rig.step_until(lambda: _leases_held(rig.cache) == 0)

    endings = {rid: _ending(received) for rid, received in rig.out.items()}
    assert isinstance(endings.pop("heavy-5"), QueueFullError)
    assert isinstance(endings.pop("late"), QueueTimeoutError)
    assert isinstance(endings.pop("bomb"), GenerationError)
    assert isinstance(endings.pop("lost"), KeyError)  # the load's own error: no such artifact
    assert endings.pop("gated") == endings.pop("quitter") == FINISH_ABORT
    assert set(endings.values()) == {"length"}, endings
    last = rig.out["traced"][-1]
    assert isinstance(last, TokenDelta) and last.trace is not None
    assert rig.preempted, "the traffic was meant to preempt"
    core.check_integrity()
    assert core.runner.stream_ids() == frozenset()
    assert core.scheduler.blocks.usage == 0
    core.scheduler.blocks.check_integrity()
    rig.cache.check_integrity()


def test_a_paused_request_holds_no_lease_and_is_leased_again_when_resumed(
    rig: Rig, demo_assets: DemoAssets
) -> None:
    """Paused mid-stream, a request releases its adapter's lease (the slot may be evicted);
    resumed, it is leased again through the lease window and its stream completes, whole."""
    core = rig.core
    key = demo_assets.adapters[0].key(_base_digest(demo_assets))
    request = _request(core, "p", "acme", "The acme support team", max_tokens=12)
    rig.add(dataclasses.replace(request, adapter_key=key))
    rig.step_until(lambda: len(rig.out["p"]) >= 3)
    core.pause("p")
    core.check_integrity()
    assert _leases_held(rig.cache) == 0 and core.view.num_paused == 1
    assert not core.step()  # nothing to run while paused
    core.resume("p")
    rig.step_until(lambda: not rig.live("p"))
    deltas = [d for d in rig.out["p"] if isinstance(d, TokenDelta)]
    assert len(deltas) == len(rig.out["p"]) and deltas[-1].finish_reason == "length"
    assert sum(len(d.token_ids) for d in deltas) == deltas[-1].completion_tokens == 12
    assert (core.view.num_pauses, core.view.num_resumes) == (1, 1)
    assert _leases_held(rig.cache) == 0
    rig.cache.check_integrity()


def test_a_paused_stream_that_kept_its_kv_resumes_with_no_recompute_and_the_same_tokens(
    rig: Rig, demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause keeps the request's KV (``sched/kept_kv.py``) while its lease goes: resumed, it
    runs the one token the pause interrupted and then decodes, and its greedy output is the
    unpaused one's, token for token. Other tenants' requests ran during the pause and were
    handed every free block in turn: a freed sequence would have had to recompute all of it."""
    core = rig.core
    key = demo_assets.adapters[0].key(_base_digest(demo_assets))
    whole = _request(core, "whole", "acme", "The acme support team", max_tokens=20)
    rig.add(dataclasses.replace(whole, adapter_key=key))
    rig.step_until(lambda: not rig.live("whole"))
    chunks: list[ScheduledChunk] = []
    real_run = core.runner.run

    def run(plan: StepPlan, params: object, *rest: object) -> object:
        chunks.extend(plan.chunks)
        return real_run(plan, params, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(core.runner, "run", run)
    rig.add(dataclasses.replace(whole, request_id="paused", adapter_key=key))
    rig.step_until(lambda: len(rig.out["paused"]) >= 4)
    req = core.scheduler.requests["paused"]
    context = req.num_tokens
    core.pause("paused")
    core.check_integrity()
    assert req.seq_id is not None and core.scheduler.num_kept_kv_blocks > 0
    assert _leases_held(rig.cache) == 0  # the slot is free; the KV is not
    for round_ in range(3):  # 6 x 3 blocks handed out, 2 sequences at a time
        others = [f"o{round_}{i}" for i in range(2)]
        for rid in others:
            rig.add(_request(core, rid, "globex", f"The globex {rid}"))
        rig.step_until(lambda ids=others: not any(map(rig.live, ids)))
    assert req.seq_id is not None and core.scheduler.pause_counts.num_kept_dropped == 0
    mark = len(chunks)
    core.resume("paused")
    rig.step_until(lambda: not rig.live("paused"))
    mine = [c for c in chunks[mark:] if c.request_id == "paused"]
    assert (mine[0].start_pos, len(mine[0].token_ids)) == (context - 1, 1)  # nothing recomputed
    assert all(len(c.token_ids) == 1 for c in mine)  # decodes only
    assert _token_ids(rig.out["paused"]) == _token_ids(rig.out["whole"])
    assert len(_token_ids(rig.out["whole"])) == 20
    assert core.scheduler.blocks.usage == 0 and core.scheduler.num_kept_kv_blocks == 0
    assert (core.view.num_pauses_kv_kept, core.view.num_paused_kv_freed) == (1, 0)
    core.scheduler.check_integrity()


def _token_ids(received: list[TokenDelta | BaseException]) -> list[int]:
    return [t for d in received if isinstance(d, TokenDelta) for t in d.token_ids]


def _base_digest(assets: DemoAssets) -> str:
    return BaseModelSpec.from_dir(assets.base_model_dir).digest


def _leases_held(cache: TieredAdapterCache) -> int:
    return sum(entry.refcount for entry in cache.snapshot().entries)


def test_check_records_names_what_disagrees(demo_assets: DemoAssets) -> None:
    """The check can fail: each broken invariant is named."""
    from loraplex.model.tokenizer import TextTokenizer

    tokenizer = TextTokenizer(demo_assets.base_model_dir)
    request = EngineRequest("r", "t", None, (3, 4), SamplingParams(max_tokens=2))
    req = Request(request, arrival_s=0.0, deadline_at_s=9.0)
    live = Live(req, lambda _: None, OutputTracker(request.params, 2, frozenset(), tokenizer))
    check_records({"r": live}, {"r": req}, 0, ())
    cases: list[tuple[dict[str, Live], int, tuple[str, ...], str]] = [
        ({}, 0, (), "requests \\['r'\\] no record"),
        ({"r": live}, 1, (), "1 traced requests counted; 0 live"),
        ({"r": live}, 0, ("gone",), "random streams of retired requests \\['gone'\\]"),
        ({"r": dataclasses.replace(live, prompt_logprobs={})}, 0, (), "prompt logprobs owed"),
        ({"r": dataclasses.replace(live, lease_tier=Tier.L1)}, 0, (), "a lease tier without"),
    ]
    for lives, traced, streams, message in cases:
        with pytest.raises(LiveRecordError, match=message):
            check_records(lives, {"r": req}, traced, streams)
