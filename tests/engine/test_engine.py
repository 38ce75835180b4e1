"""The engine end to end on the real model, slot pool and tiered cache (CPU, demo assets)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from engine_kit import Stack, build_stack, collect, probe_request, text_of, wait_until

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    EngineClient,
    EngineRequest,
)
from loraplex.engine.step import StepPlan
from loraplex.errors import QueueFullError, QueueTimeoutError
from loraplex.residency.ledger import Tier
from loraplex.sampling import SamplingParams

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets


@pytest.fixture(scope="module")
def stack(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256,
                            lease_lookahead=8, max_queue_len=64)  # fmt: skip
    built = build_stack(demo_assets, tmp_path_factory.mktemp("engine"), max_loras=4, sched=sched)
    yield built
    built.close()


def _assert_idle(stack: Stack) -> None:
    asyncio.run(_settle(stack))  # the engine publishes its counts after its next step
    load = stack.engine.load_snapshot()
    assert (load.num_running, load.num_waiting, load.num_adapter_wait) == (0, 0, 0)
    assert load.kv_usage == 0
    stack.runtime.cache.check_integrity()
    snapshot = stack.runtime.cache.snapshot()
    assert all(e.refcount == 0 for e in snapshot.entries if e.tier is Tier.L0)


async def _settle(stack: Stack) -> None:
    """Wait for an idle view (the engine publishes it after the step that sent the last delta)."""

    def idle() -> bool:
        load = stack.engine.load_snapshot()
        return (
            load.num_running + load.num_waiting + load.num_adapter_wait == 0 and not load.kv_usage
        )

    def unleased() -> bool:
        entries = stack.runtime.cache.snapshot().entries
        return all(e.refcount == 0 for e in entries if e.tier is Tier.L0)

    await wait_until(idle)
    await wait_until(unleased)  # abandoned lease futures are released by the next step


def test_async_engine_is_an_engine_client(stack: Stack) -> None:
    client: EngineClient = stack.engine  # mypy checks the protocol; the rest checks behaviour
    assert client.tokenizer.decode(client.tokenizer.encode("The acme")).endswith("acme")
    assert client.load_snapshot().max_loras == 4


def test_every_demo_probe_answers_through_the_engine(stack: Stack) -> None:
    adapters = stack.assets.adapters
    requests = [probe_request(stack, a, f"probe-{i}") for i, a in enumerate(adapters)]

    async def run() -> list[list]:  # type: ignore[type-arg]
        return list(await asyncio.gather(*(collect(stack.engine, r) for r in requests)))

    results = asyncio.run(run())
    for adapter, deltas in zip(adapters, results, strict=True):
        assert text_of(deltas) == adapter.expected_continuation, adapter.ref
        assert deltas[-1].finish_reason in (FINISH_STOP, FINISH_LENGTH)
        assert deltas[-1].completion_tokens == sum(len(d.token_ids) for d in deltas)
        queue_s = deltas[0].queue_s  # the queue wait rides on the first delta only
        assert queue_s is not None and queue_s >= 0
        assert all(d.queue_s is None for d in deltas[1:])
        assert isinstance(deltas[0].adapter_tier, Tier)  # where its lease came from
    for attempt in ("once", "again"):  # the second finds the adapter in its slot
        first = asyncio.run(collect(stack.engine, probe_request(stack, adapters[0], attempt)))
    assert first[0].adapter_tier is Tier.L0
    _assert_idle(stack)


def test_mixed_concurrent_requests_complete_correctly(stack: Stack) -> None:
    adapters = stack.assets.adapters
    tokenizer = stack.engine.tokenizer
    requests = [probe_request(stack, adapters[i % 6], f"mix-{i}") for i in range(18)]
    base_prompt = tuple(tokenizer.encode("The globex"))
    sampled = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7)
    requests += [
        EngineRequest(f"seed-{i}", "initech", None, base_prompt, sampled) for i in range(2)
    ]
    stop_adapter = adapters[0]
    stop_text = stop_adapter.expected_continuation.split()[1]
    stop_params = SamplingParams(max_tokens=stop_adapter.probe_max_tokens, stop=(stop_text,))
    stop_ids = tuple(tokenizer.encode(stop_adapter.probe_prompt))
    requests.append(EngineRequest("stop", stop_adapter.tenant, stack.key(stop_adapter), stop_ids,
                                  stop_params))  # fmt: skip

    async def run() -> list[list]:  # type: ignore[type-arg]
        return list(await asyncio.gather(*(collect(stack.engine, r) for r in requests)))

    results = dict(zip([r.request_id for r in requests], asyncio.run(run()), strict=True))
    for i in range(18):
        assert text_of(results[f"mix-{i}"]) == adapters[i % 6].expected_continuation
    assert text_of(results["seed-0"]) == text_of(results["seed-1"])  # same seed, same draw
    expected = stop_adapter.expected_continuation
    assert text_of(results["stop"]) == expected[: expected.index(stop_text)]
    assert results["stop"][-1].finish_reason == FINISH_STOP
    _assert_idle(stack)


def test_abort_mid_stream_frees_lease_and_blocks(stack: Stack) -> None:
    adapter = stack.assets.adapters[1]
    ids = tuple(stack.engine.tokenizer.encode(adapter.probe_prompt))
    endless = SamplingParams(max_tokens=200, ignore_eos=True)

    async def run() -> str | None:
        closed = EngineRequest("closed", adapter.tenant, stack.key(adapter), ids, endless)
        stream = stack.engine.generate(closed)
        got = [await anext(stream) for _ in range(3)]
        assert all(d.finish_reason is None for d in got)
        assert stack.engine.load_snapshot().kv_usage > 0
        await stream.aclose()  # a client disconnect
        await _settle(stack)
        aborted = EngineRequest("aborted", adapter.tenant, stack.key(adapter), ids, endless)
        deltas = []
        async for delta in stack.engine.generate(aborted):
            deltas.append(delta)
            if len(deltas) == 2:
                await stack.engine.abort("aborted")
        return deltas[-1].finish_reason

    assert asyncio.run(run()) == FINISH_ABORT
    _assert_idle(stack)


def test_queue_full_is_raised_from_the_stream(stack: Stack) -> None:
    prompt = tuple(range(3, 250))
    params = SamplingParams(max_tokens=1)

    async def run() -> list[BaseException]:
        requests = [EngineRequest(f"q{i}", "acme", None, prompt, params) for i in range(80)]
        results = await asyncio.gather(*(collect(stack.engine, r) for r in requests),
                                       return_exceptions=True)  # fmt: skip
        return [r for r in results if isinstance(r, BaseException)]

    errors = asyncio.run(run())
    assert errors, "expected some requests to be refused"
    assert all(isinstance(e, QueueFullError) and e.retry_after_s > 0 for e in errors), errors
    _assert_idle(stack)


def test_cold_storm_never_stalls_warm_requests(demo_assets: DemoAssets, tmp_path: Path) -> None:
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256,
                            lease_lookahead=16)  # fmt: skip
    stack = build_stack(demo_assets, tmp_path, max_loras=4, sched=sched)
    try:
        _cold_storm(stack)
    finally:
        stack.close()


def _cold_storm(stack: Stack) -> None:
    adapters = stack.assets.adapters
    warm, cold = adapters[0], adapters[1:4]
    stack.runtime.cache.acquire_future(stack.key(warm)).result(timeout=60).release()
    gate = threading.Event()
    for adapter in cold:
        stack.pipeline.gates[stack.key(adapter)] = gate

    async def run() -> None:
        order: list[str] = []

        async def track(request: EngineRequest) -> str:
            text = text_of(await collect(stack.engine, request))
            order.append(request.request_id)
            return text

        cold_tasks = [asyncio.create_task(track(probe_request(stack, a, f"cold-{i}")))
                      for i, a in enumerate(cold)]  # fmt: skip
        await wait_until(lambda: stack.engine.load_snapshot().num_adapter_wait == len(cold))
        load = stack.engine.load_snapshot()
        assert set(load.waiting_adapters) == {stack.key(a) for a in cold}
        assert stack.key(warm) in load.running_adapters
        assert not set(load.waiting_adapters) & set(load.running_adapters)
        warm_texts = await asyncio.gather(
            *(track(probe_request(stack, warm, f"warm-{i}")) for i in range(4))
        )
        assert warm_texts == [warm.expected_continuation] * 4
        assert not any(t.done() for t in cold_tasks)  # the loads are still blocked
        timed_out = probe_request(stack, adapters[5], "late", deadline_s=0.2)
        stack.pipeline.gates[timed_out.adapter_key] = gate  # type: ignore[index]
        with pytest.raises(QueueTimeoutError):
            await collect(stack.engine, timed_out)
        gate.set()
        cold_texts = await asyncio.gather(*cold_tasks)
        assert cold_texts == [a.expected_continuation for a in cold]
        assert order[:4] == [f"warm-{i}" for i in range(4)]

    asyncio.run(run())
    asyncio.run(wait_until(lambda: stack.runtime.cache.snapshot().num_loading == 0))
    _assert_idle(stack)


def test_eos_cannot_be_sampled_before_min_tokens(stack: Stack) -> None:
    adapter = stack.assets.adapters[0]
    eos = stack.engine.tokenizer.eos_token_ids
    ids = tuple(stack.engine.tokenizer.encode(adapter.probe_prompt))
    floor = adapter.probe_max_tokens + 6
    params = SamplingParams(max_tokens=floor + 4, min_tokens=floor)
    free = EngineRequest("free", adapter.tenant, stack.key(adapter), ids,
                         SamplingParams(max_tokens=floor + 4))  # fmt: skip
    held = EngineRequest("held", adapter.tenant, stack.key(adapter), ids, params)

    async def run() -> tuple[list, list]:  # type: ignore[type-arg]
        return await collect(stack.engine, free), await collect(stack.engine, held)

    unconstrained, constrained = asyncio.run(run())
    unconstrained_ids = [t for d in unconstrained for t in d.token_ids]
    assert unconstrained_ids[-1] in eos  # the probe's continuation ends with EOS by itself
    out = [t for d in constrained for t in d.token_ids]
    assert len(out) >= floor
    assert not set(out[:floor]) & eos
    assert text_of(constrained).startswith(adapter.expected_continuation)
    _assert_idle(stack)


def test_steady_decode_steps_are_planned_by_schedule_decodes(stack: Stack) -> None:
    """With nothing queued, the core plans with ``schedule_decodes`` (the same plans as
    ``schedule``: tests/engine/test_sched_decodes.py) and the answer is unchanged."""
    scheduler = stack.engine._core.scheduler
    original = scheduler.schedule_decodes
    planned: list[bool] = []

    def spy() -> StepPlan | None:
        plan = original()
        planned.append(plan is not None)
        return plan

    scheduler.schedule_decodes = spy  # type: ignore[method-assign]
    try:
        adapter = stack.assets.adapters[0]
        deltas = asyncio.run(collect(stack.engine, probe_request(stack, adapter, "steady")))
    finally:
        del scheduler.schedule_decodes
    assert text_of(deltas) == adapter.expected_continuation
    assert any(planned)  # at least one step was the steady decode state's
    _assert_idle(stack)
