"""The engine's record of a traced request (``EngineRequest.traceparent``), on the real model,
slot pool and tiered cache: a cold adapter's deferral, tier, placement and load stages; the
batches it took part in; its KV prefix reuse; and nothing at all for an untraced request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest
from engine_kit import Stack, build_stack, collect, probe_request, wait_until

from loraplex.demo.assets import DemoAdapter, DemoAssets
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.residency.ledger import Tier

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def stack(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256,
                            lease_lookahead=8, max_queue_len=64)  # fmt: skip
    built = build_stack(demo_assets, tmp_path_factory.mktemp("traces"), max_loras=2, sched=sched)
    yield built
    built.close()


def _last(deltas: list[TokenDelta]) -> TokenDelta:
    assert all(d.trace is None for d in deltas[:-1])  # only the last delta carries it
    return deltas[-1]


def _gated(stack: Stack, request: EngineRequest, adapter: DemoAdapter) -> list[TokenDelta]:
    """``request``'s deltas, its adapter's load held until the request waits for it."""
    gate = threading.Event()
    stack.pipeline.gates[stack.key(adapter)] = gate

    async def run() -> list[TokenDelta]:
        task = asyncio.ensure_future(collect(stack.engine, request))
        await wait_until(lambda: stack.engine.load_snapshot().num_adapter_wait == 1)
        gate.set()
        return await task

    return asyncio.run(run())


def test_a_cold_adapter_shows_deferral_tier_and_load_stages(stack: Stack) -> None:
    adapter = stack.assets.adapters[0]
    request = probe_request(stack, adapter, "cold-1", traceparent=PARENT)
    deltas = _gated(stack, request, adapter)
    trace = _last(deltas).trace
    assert trace is not None
    assert trace.placement == "loaded" and trace.adapter_tier is Tier.L3
    assert trace.deferred_s is not None and trace.deferred_s > 0
    stages = [stage for stage, _ in trace.load_stages]
    assert {"fetch", "verify", "copy"} <= set(stages)
    assert trace.leased_offset_s is not None and trace.queue_s is not None
    assert trace.leased_offset_s <= trace.queue_s + 1e-6  # leased, then scheduled
    assert sum(run.num_steps for run in trace.batches) == deltas[-1].completion_tokens
    assert all(run.strategy in {"masked", "grouped", "loop"} for run in trace.batches)
    assert trace.prefix_reused_tokens == 0
    assert trace.end_offset_s >= trace.queue_s


def test_a_warm_repeat_is_resident_and_reuses_its_prefix(stack: Stack) -> None:
    adapter = stack.assets.adapters[0]
    first = probe_request(stack, adapter, "warm-1", traceparent=PARENT)
    long_prompt = first.prompt_token_ids * 4  # several KV blocks of 8 tokens
    asyncio.run(collect(stack.engine, replace(first, prompt_token_ids=long_prompt)))
    again = replace(first, request_id="warm-2", prompt_token_ids=long_prompt)
    trace = _last(asyncio.run(collect(stack.engine, again))).trace
    assert trace is not None
    assert trace.placement == "resident" and trace.adapter_tier is Tier.L0
    assert trace.deferred_s is None and trace.load_stages == ()
    assert trace.prefix_reused_tokens is not None and trace.prefix_reused_tokens >= 8


def test_an_untraced_request_carries_no_trace(stack: Stack) -> None:
    adapter = stack.assets.adapters[1]
    deltas = asyncio.run(collect(stack.engine, probe_request(stack, adapter, "plain")))
    assert deltas[-1].finish_reason is not None
    assert all(d.trace is None for d in deltas)


def test_an_aborted_traced_request_closes_with_its_trace(stack: Stack) -> None:
    adapter = stack.assets.adapters[0]
    request = probe_request(stack, adapter, "aborted", traceparent=PARENT)
    request = replace(request, params=replace(request.params, max_tokens=200, ignore_eos=True))

    async def run() -> list[TokenDelta]:
        got: list[TokenDelta] = []
        async for delta in stack.engine.generate(request):
            got.append(delta)
            if len(got) == 2:
                await stack.engine.abort(request.request_id)
        return got

    deltas = asyncio.run(run())
    assert deltas[-1].finish_reason == "abort"
    trace = deltas[-1].trace
    assert trace is not None and trace.batches


def test_an_untraced_request_asking_for_its_stages_gets_them_with_its_loads_end(
    stack: Stack,
) -> None:
    """``stages`` (the front's request log asks) records the stages without a trace; a waiting
    lease's load completion is stamped (``ready_offset_s``) no later than its collection."""
    adapter = stack.assets.adapters[5]
    request = probe_request(stack, adapter, "staged-1", stages=True)
    trace = _last(_gated(stack, request, adapter)).trace
    assert trace is not None and trace.placement == "loaded"
    assert trace.deferred_s is not None and trace.leased_offset_s is not None
    assert trace.ready_offset_s is not None
    asked = trace.leased_offset_s - trace.deferred_s
    assert asked <= trace.ready_offset_s <= trace.leased_offset_s
    warm = replace(request, request_id="staged-2")
    again = _last(asyncio.run(collect(stack.engine, warm))).trace
    assert again is not None and again.ready_offset_s is None  # leased at once
