"""The attack kinds' own process (``bench/serve/attack_process.py``): the attack runs outside
the victims' client's process, and what it returns reaches the report unchanged."""

from __future__ import annotations

import asyncio
import functools
import os

import pytest

from loraplex.bench.serve.attack_kinds import KindPlan, KindTarget, Tally
from loraplex.bench.serve.attack_process import AttackProcess, AttackProcessError, AttackResult

PLAN = KindPlan(1.0, 1.0, 1, 1, 1.0, 5.0, 100, 0)
TARGET = KindTarget("http://127.0.0.1:1", "key", os.getpid())


async def reporting_attack(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    """Runs until ``stop``; reports where it ran and what it was given."""
    await stop.wait()
    return {"pid": os.getpid(), "server_pid": target.server_pid, "statuses": {"200": 3},
            "hang_s": plan.hang_s}  # fmt: skip


async def failing_attack(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    raise OSError("no route")


def _attacked(process: AttackProcess[Tally]) -> AttackResult[Tally]:
    """Runs ``process`` from start to its result, closing it however that ends."""
    try:
        process.start()
        process.go()
        return process.finish()
    finally:
        process.close()


def test_the_attack_runs_in_its_own_process_and_its_tally_comes_back_unchanged() -> None:
    result = _attacked(AttackProcess(functools.partial(reporting_attack, TARGET, PLAN)))
    assert result.tally["pid"] != os.getpid()  # not this (the victims' client's) process
    assert result.tally["server_pid"] == os.getpid() and result.tally["hang_s"] == 1.0
    assert result.tally["statuses"] == {"200": 3}  # nested counters survive as they were
    assert result.cpu_s >= 0.0


def test_a_failing_attack_fails_the_run_naming_its_error() -> None:
    process = AttackProcess(functools.partial(failing_attack, TARGET, PLAN))
    try:
        process.start()
        process.go()
        with pytest.raises(AttackProcessError, match="OSError: no route"):
            process.finish()
    finally:
        process.close()


def test_close_ends_a_child_that_never_got_go() -> None:
    process = AttackProcess(functools.partial(reporting_attack, TARGET, PLAN))
    process.start()
    process.close()  # no hang: ``close`` releases a child still waiting for go


async def policy_attack(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    """Reports the scheduling policy its process (and a thread it starts) runs under."""
    await stop.wait()
    in_thread = await asyncio.to_thread(os.sched_getscheduler, 0)
    return {"policy": os.sched_getscheduler(0), "thread_policy": in_thread}


@pytest.mark.parametrize(("priority", "policy"), [("idle", os.SCHED_IDLE), ("normal", None)])
def test_the_attack_process_runs_at_the_priority_asked(priority: str, policy: int | None) -> None:
    """``normal`` is the server's own policy, inherited (SCHED_OTHER unless the whole run was
    started under another, e.g. ``chrt -i 0``)."""
    own = os.sched_getscheduler(0)
    expected = own if policy is None else policy
    result = _attacked(AttackProcess(functools.partial(policy_attack, TARGET, PLAN), priority))
    assert result.tally == {"policy": expected, "thread_policy": expected}
    assert os.sched_getscheduler(0) == own  # the victims' client is left as it was


def test_an_unknown_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="priority 'low' is invalid"):
        AttackProcess(functools.partial(policy_attack, TARGET, PLAN), "low")
