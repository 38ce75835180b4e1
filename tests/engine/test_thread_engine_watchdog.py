"""The watchdog on a thread engine (what a fleet replica runs): its loop stalled with a request
live makes it hung (not up, new requests refused at once); a slow adapter load does not (the loop
turns while the request waits for its adapter); neither does idleness; moving again clears it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from engine_kit import Stack, build_stack, collect, probe_request, text_of, wait_until

from loraplex.demo.assets import DemoAssets
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.watchdog import WatchdogPolicy
from loraplex.errors import EngineUnavailableError

BOUND_S = 0.5


def test_a_stalled_engine_loop_is_hung_but_an_idle_one_or_a_slow_load_is_not(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256)
    policy = WatchdogPolicy(hung_after_s=BOUND_S, kill_after_s=BOUND_S)
    stack = build_stack(demo_assets, tmp_path, max_loras=2, sched=sched, watchdog=policy)
    try:
        asyncio.run(_scenario(stack))
    finally:
        stack.close()


async def _scenario(stack: Stack) -> None:
    engine, cold, warm = stack.engine, stack.assets.adapters[1], stack.assets.adapters[0]
    await asyncio.sleep(3 * BOUND_S)
    assert engine.health().up  # idle: never hung

    gate = threading.Event()
    stack.pipeline.gates[stack.key(cold)] = gate
    slow = asyncio.create_task(collect(engine, probe_request(stack, cold, "slow-load")))
    await wait_until(lambda: engine.load_snapshot().num_adapter_wait == 1)
    for _ in range(6):  # three bounds of a load that does not finish
        await asyncio.sleep(BOUND_S / 2)
        assert engine.health().up
    gate.set()
    assert text_of(await slow) == cold.expected_continuation

    warmed = await collect(engine, probe_request(stack, warm, "warm-up"))  # now in a GPU slot
    assert text_of(warmed) == warm.expected_continuation
    with stack.runtime.slot_lock:  # every forward takes it: the loop stalls in its next step
        stalled = asyncio.create_task(collect(engine, probe_request(stack, warm, "stalled")))
        await wait_until(lambda: not engine.health().up, timeout_s=30)
        health = engine.health()
        assert health.hung and health.down_reason is not None
        assert "hung" in health.down_reason
        with pytest.raises(EngineUnavailableError, match="hung"):
            await collect(engine, probe_request(stack, warm, "refused"))
        await asyncio.sleep(3 * BOUND_S)  # past the kill bound: a thread is not killed
        assert not stalled.done()
    assert text_of(await stalled) == warm.expected_continuation
    await wait_until(lambda: engine.health().up)
    assert text_of(await collect(engine, probe_request(stack, warm, "after"))) == (
        warm.expected_continuation
    )
