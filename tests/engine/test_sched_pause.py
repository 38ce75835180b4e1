"""Paused requests (``Scheduler.pause``): a request whose consumer stopped reading holds no seat
(and, with ``max_paused_kv_fraction`` 0, no KV block) and is never scheduled until resumed; then
it finishes as a preempted one. Pauses that keep their KV: tests/engine/test_sched_kept_kv.py."""

from __future__ import annotations

import dataclasses

from sched_kit import Driver, adapter, request

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import FINISH_ABORT
from loraplex.engine.request import RequestState

ONE_SEAT = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64)
FREE_ON_PAUSE = dataclasses.replace(ONE_SEAT, max_paused_kv_fraction=0.0)


def _scheduled(driver: Driver) -> set[str]:
    return {c.request_id for plan in driver.plans for c in plan.chunks}


def test_a_paused_request_frees_its_seat_and_the_other_tenant_completes() -> None:
    driver = Driver(FREE_ON_PAUSE)
    driver.add(request("stuck", "hog", out=40))
    driver.step()
    stuck = driver.scheduler.requests["stuck"]
    assert stuck.state is RequestState.RUNNING and driver.blocks.usage > 0
    driver.add(request("victim", "other", out=5, first=20))
    assert driver.scheduler.pause(stuck)
    assert driver.scheduler.running == [] and driver.blocks.usage == 0  # seat and KV freed
    assert driver.scheduler.num_paused == 1 and driver.scheduler.is_paused("stuck")
    driver.plans.clear()
    for _ in range(20):
        driver.step()
    assert driver.finished == ["victim"]
    assert "stuck" not in _scheduled(driver)  # never scheduled while paused
    assert driver.scheduler.requests["stuck"] is stuck and not stuck.lease
    produced = len(stuck.output_token_ids)
    assert driver.scheduler.resume("stuck") and driver.scheduler.num_paused == 0
    for _ in range(80):
        driver.step()
    assert driver.finished == ["victim", "stuck"]
    assert len(stuck.output_token_ids) == 40 > produced  # recomputed, then went on
    driver.blocks.check_integrity()


def test_pause_and_resume_are_idempotent_and_a_paused_request_can_be_retired() -> None:
    driver = Driver(ONE_SEAT)
    driver.add(request("a", "t", out=10))
    driver.add(request("b", "t", out=10, first=30))  # queued behind a
    driver.step()
    a, b = driver.scheduler.requests["a"], driver.scheduler.requests["b"]
    assert driver.scheduler.pause(b) and not driver.scheduler.pause(b)  # queued: leaves queue
    assert driver.scheduler.num_queued == 0
    assert driver.scheduler.pause(a)
    assert not driver.scheduler.resume("nope")
    # Retiring a paused request (its client's connection was cut) leaves nothing behind, even
    # once its tenant has gone idle.
    driver.scheduler.finish(a, RequestState.ABORTED, FINISH_ABORT)
    driver.scheduler.finish(b, RequestState.ABORTED, FINISH_ABORT)
    assert driver.scheduler.requests == {} and driver.scheduler.num_paused == 0
    assert not driver.scheduler.resume("a")
    driver.add(request("c", "t", out=2))
    for _ in range(5):
        driver.step()
    assert driver.finished == ["c"]


def test_a_request_waiting_for_its_adapter_is_not_paused() -> None:
    key = adapter("cold")
    driver = Driver(ONE_SEAT)
    driver.add(request("r", "t", key=key))
    driver.step()
    req = driver.scheduler.requests["r"]
    assert req.state is RequestState.ADAPTER_WAIT
    assert not driver.scheduler.pause(req) and driver.scheduler.num_paused == 0
    driver.load(key)
    for _ in range(10):
        driver.step()
    assert driver.finished == ["r"]


def test_resuming_after_the_tenant_went_idle_requeues_it() -> None:
    driver = Driver(ONE_SEAT)
    driver.add(request("x", "t", out=10))
    driver.add(request("y", "t", out=2, first=30))
    driver.step()
    assert driver.scheduler.pause(driver.scheduler.requests["x"])
    for _ in range(10):  # y runs and finishes: tenant t has nothing queued or running
        driver.step()
    assert driver.finished == ["y"]
    assert driver.scheduler.resume("x")
    for _ in range(30):
        driver.step()
    assert driver.finished == ["y", "x"]


def test_a_paused_request_releases_its_lease_and_asks_for_it_again_when_resumed() -> None:
    """A paused request does no work: its adapter's slot must not stay pinned for it (one
    tenant's stuck streams on many adapters would hold every slot); resumed, it goes through
    the lease window again, and its wait for the lease gets a fresh deadline."""
    key = adapter("a1", "hog")
    driver = Driver(ONE_SEAT, resident={key})
    driver.add(request("stuck", "hog", key=key, out=20, deadline_s=1.0))
    driver.step()
    stuck = driver.scheduler.requests["stuck"]
    (first,) = driver.leases
    assert stuck.state is RequestState.RUNNING and stuck.lease is first
    assert driver.scheduler.pause(stuck)
    assert first.released and stuck.lease is None  # the slot is free for other adapters
    assert driver.scheduler.make_stats().num_pauses == 1
    driver.clock.advance(5.0)  # paused past its deadline: the client's time, not the queue's
    driver.step()
    assert driver.leases == [first]  # not asked for while paused
    driver.resident.clear()  # its adapter was evicted meanwhile: resumed, it must load again
    assert driver.scheduler.resume("stuck")
    assert stuck.deadline_at_s > driver.clock.now()
    driver.step()
    assert stuck.state is RequestState.ADAPTER_WAIT  # asked through the lease window
    driver.load(key)
    for _ in range(40):
        driver.step()
    assert driver.finished == ["stuck"] and len(stuck.output_token_ids) == 20
    assert stuck.lease is None and all(lease.released for lease in driver.leases)
    stats = driver.scheduler.make_stats()
    assert (stats.num_pauses, stats.num_resumes, stats.num_paused) == (1, 1, 0)
