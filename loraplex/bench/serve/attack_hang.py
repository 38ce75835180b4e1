"""``bench serve``'s hung-engine kind: the server's engine process stopped (SIGSTOP) for a
bounded time, then resumed (SIGCONT), while the victims' trace runs.

Issue 25: with the engine stopped for 37 s, ``/ready`` stayed ready and every request hung
until it resumed. The stop starts ``hang_start_s`` into the run, so requests are in flight when
it begins and more arrive during it. SIGCONT is sent however the stop ends (its time is up,
the run is cancelled, the benchmark is interrupted): a stopped engine must not outlive the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

from loraplex.bench.proc_tree import engine_child
from loraplex.bench.serve.attack_kinds import KindPlan, KindTarget, Tally

HANG_START_S = 2.0  # seconds into the run the engine is stopped (a quarter of a shorter run)

Signal = Callable[[int, int], None]  # os.kill's shape (tests record the calls)


def hang_start_s(duration_s: float) -> float:
    """When the stop begins: ``HANG_START_S``, or a quarter of a trace shorter than 8 s."""
    return min(HANG_START_S, duration_s / 4)


@contextlib.contextmanager
def stopped(pid: int, send: Signal = os.kill) -> Iterator[None]:
    """``pid`` is stopped for the block; SIGCONT on every way out of it."""
    send(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # it died meanwhile: nothing to resume
            send(pid, signal.SIGCONT)


async def hold_stopped(pid: int, hang_s: float, send: Signal = os.kill) -> float:
    """Stops ``pid`` for ``hang_s`` seconds (fewer if cancelled); the seconds it was stopped."""
    began = time.monotonic()
    with stopped(pid, send):
        await asyncio.sleep(hang_s)
    return time.monotonic() - began


async def hung_engine(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    """Its bound is ``plan.hang_s``, not ``stop``: a stop begun is held to its end."""
    await asyncio.sleep(hang_start_s(plan.duration_s))
    pid = engine_child(target.server_pid)
    stopped_s = await hold_stopped(pid, plan.hang_s)
    return {"engine_pid": pid, "started_s": hang_start_s(plan.duration_s),
            "stopped_s": round(stopped_s, 3)}  # fmt: skip
