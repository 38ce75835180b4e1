"""Pauses that keep their KV (``sched/kept_kv.py``): a paused request keeps its KV sequence
within ``max_paused_kv_fraction`` of the cache, a fair part of it against other tenants' pauses
and its tenant's ``max_kv_blocks``, and resumed it decodes on without recomputing (what a resume
does recompute is counted); kept sequences give their blocks up before any running one whenever
running or waiting work needs them; retiring one frees them."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_kit import Driver, request

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import FINISH_ABORT
from loraplex.engine.request import RequestState
from loraplex.engine.step import ScheduledChunk
from loraplex.engine.tenant_shares import TenantBook, TenantSettings
from loraplex.errors import CacheIntegrityError

ONE_SEAT = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=48)
TWO_SEATS = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=48)
KEEP_ALL = dataclasses.replace(TWO_SEATS, max_paused_kv_fraction=1.0)


def _chunks_of(driver: Driver, rid: str, since: int = 0) -> list[ScheduledChunk]:
    return [c for plan in driver.plans[since:] for c in plan.chunks if c.request_id == rid]


def _preempted(driver: Driver) -> list[str]:
    return [rid for plan in driver.plans for rid in plan.preempted]


def _run(driver: Driver, steps: int) -> None:
    for _ in range(steps):
        driver.step()
        driver.scheduler.check_integrity()


@pytest.mark.parametrize("fraction", [0.25, 0.0])
def test_a_resumed_request_that_kept_its_kv_computes_only_its_last_token(fraction: float) -> None:
    """Kept, the first chunk after the resume is the one decode the pause interrupted. With
    keeping off (0) its blocks were freed; other work ran meanwhile and was handed them (the
    prefix cache keeps freed blocks only until the allocator reaches them), so the resume
    recomputes the whole context."""
    driver = Driver(dataclasses.replace(ONE_SEAT, max_paused_kv_fraction=fraction))
    driver.add(request("s", "t", prompt=10, out=20))
    _run(driver, 7)
    s = driver.scheduler.requests["s"]
    usage, context = driver.blocks.usage, s.num_tokens
    assert len(s.output_token_ids) == 7 and s.num_computed_tokens == context - 1
    assert driver.scheduler.pause(s) and driver.scheduler.running == []
    if fraction:
        assert driver.blocks.usage == usage and s.seq_id is not None  # the KV stays
        assert driver.scheduler.num_kept_kv_blocks == 4  # 17 positions in blocks of 4
    else:
        assert driver.blocks.usage == 0 and driver.scheduler.num_kept_kv_blocks == 0
    since = len(driver.plans)
    for i in range(6):  # 66 blocks handed out in turn: every free block once
        driver.add(request(f"c{i}", "other", prompt=40, out=4, first=100 + 50 * i))
    _run(driver, 40)
    assert driver.finished == [f"c{i}" for i in range(6)]
    assert _chunks_of(driver, "s", since) == []  # never scheduled while paused
    assert driver.scheduler.resume("s")
    _run(driver, 1)
    (first,) = _chunks_of(driver, "s", since)
    assert context - first.start_pos == (1 if fraction else context)  # tokens computed again
    _run(driver, 30)
    assert driver.finished[6:] == ["s"] and len(s.output_token_ids) == 20
    assert driver.blocks.usage == 0
    stats = driver.scheduler.make_stats()
    assert (stats.num_pauses, stats.num_resumes) == (1, 1)
    assert (stats.num_pauses_kv_kept, stats.num_paused_kv_freed) == (int(fraction > 0), 0)
    # freed, the resume computed again every token computed before the pause: all but the last
    assert stats.num_resume_recomputed_tokens == (0 if fraction else context - 1)


def test_running_work_takes_a_kept_sequences_blocks_before_preempting_anyone() -> None:
    """12 blocks: the paused request keeps 5, the other tenant's stream grows to 11 and takes
    them; no running sequence is preempted, and the paused one recomputes once resumed."""
    driver = Driver(KEEP_ALL, num_blocks=12)
    driver.add(request("p", "a", prompt=16, out=24))
    _run(driver, 5)
    p = driver.scheduler.requests["p"]
    computed = p.num_computed_tokens
    assert driver.scheduler.pause(p) and driver.scheduler.num_kept_kv_blocks == 5
    driver.add(request("g", "b", prompt=8, out=36, first=50))
    _run(driver, 40)
    assert driver.finished == ["g"] and _preempted(driver) == []
    assert p.seq_id is None and driver.scheduler.num_kept_kv_blocks == 0
    assert driver.scheduler.pause_counts.num_kept_dropped == 1
    since = len(driver.plans)
    assert driver.scheduler.resume("p")
    _run(driver, 30)
    assert driver.finished == ["g", "p"] and len(p.output_token_ids) == 24
    first = _chunks_of(driver, "p", since)[0]  # recomputed: most of its blocks went to g
    assert first.start_pos < 16 and len(first.token_ids) > 1
    assert driver.blocks.usage == 0
    # what it had computed, less the prefix the cache still held (``start_pos``)
    recomputed = driver.scheduler.make_stats().num_resume_recomputed_tokens
    assert recomputed == computed - first.start_pos > 0


def test_a_waiting_request_takes_a_kept_sequences_blocks() -> None:
    """8 blocks: the paused request keeps 4; a new 20-token prompt needs 5 and is admitted at
    once, the kept sequence freed for it."""
    driver = Driver(KEEP_ALL, num_blocks=8)
    driver.add(request("p", "a", prompt=12, out=20))
    _run(driver, 4)
    p = driver.scheduler.requests["p"]
    assert driver.scheduler.pause(p) and driver.scheduler.num_kept_kv_blocks == 4
    driver.add(request("w", "b", prompt=20, out=4, first=40))
    _run(driver, 1)
    assert _chunks_of(driver, "w") and p.seq_id is None
    assert driver.scheduler.pause_counts.num_kept_dropped == 1


def test_retiring_a_request_that_kept_its_kv_frees_it() -> None:
    """Cancelled while paused, or resumed and cancelled before it ran again: no block leaks."""
    driver = Driver(KEEP_ALL)
    driver.add(request("a", "t", prompt=8, out=20))
    driver.add(request("b", "u", prompt=8, out=20, first=30))
    _run(driver, 3)
    a, b = driver.scheduler.requests["a"], driver.scheduler.requests["b"]
    assert driver.scheduler.pause(a) and driver.scheduler.pause(b)
    assert driver.scheduler.resume("b")  # queued again, its sequence still kept
    assert b.state is RequestState.WAITING and b.seq_id is not None
    assert driver.blocks.usage > 0 and driver.scheduler.num_kept_kv_blocks == 6
    driver.scheduler.finish(a, RequestState.ABORTED, FINISH_ABORT)
    driver.scheduler.finish(b, RequestState.ABORTED, FINISH_ABORT)
    assert driver.blocks.usage == 0 and driver.scheduler.num_kept_kv_blocks == 0
    driver.scheduler.check_integrity()


def test_a_tenant_pausing_many_streams_cannot_take_another_tenants_share() -> None:
    """A quarter of 64 blocks (16), 3-block streams: eight of one tenant paused at once keep
    five (15 blocks, the bound); the rest free theirs. Another tenant's pauses then still keep
    theirs, each freeing the hostile tenant's oldest while it keeps more than the other would
    (before, the bound was full and they recomputed on resume), down to a fair split (9 and 6
    blocks); a further hostile pause cannot take the other's back."""
    cfg = SchedulerConfig(
        max_num_seqs=12, max_num_batched_tokens=192, max_model_len=48, step_work_ratio=0
    )
    driver = Driver(cfg)
    for i in range(9):
        driver.add(request(f"h{i}", "hostile", prompt=8, out=30, first=10 * i))
    for i in range(3):
        driver.add(request(f"v{i}", "victim", prompt=8, out=30, first=100 + 10 * i))
    _run(driver, 4)
    book = driver.scheduler
    hostile = [book.requests[f"h{i}"] for i in range(9)]
    victims = [book.requests[f"v{i}"] for i in range(3)]
    assert all(len(driver.blocks.block_table(r.seq_id or 0)) == 3 for r in hostile + victims)
    for req in hostile[:8]:
        assert book.pause(req)
    assert book.num_kept_kv_blocks == 15 <= 64 // 4
    assert [r.seq_id is not None for r in hostile[:8]] == [True] * 5 + [False] * 3
    assert book.pause(victims[0]) and victims[0].seq_id is not None  # h0 freed for it
    assert book.pause(victims[1]) and victims[1].seq_id is not None  # h1 freed for it
    assert [r.seq_id is not None for r in hostile[:5]] == [False, False, True, True, True]
    assert book.pause(victims[2]) and victims[2].seq_id is None  # 9 blocks vs 9: fair already
    assert book.pause(hostile[8]) and hostile[8].seq_id is None  # 12 vs 6: nothing taken back
    assert all(v.seq_id is not None for v in victims[:2])
    assert book.num_kept_kv_blocks == 15
    counts = book.pause_counts
    assert (counts.num_kept, counts.num_kept_dropped) == (7, 2)
    book.check_integrity()


def test_kept_blocks_count_against_the_tenants_max_kv_blocks() -> None:
    """A tenant capped at 8 blocks keeps a paused sequence only within the cap, beside its
    running ones; once its running sequence grows past what the cap leaves, the kept one goes
    (before any running sequence of anyone gives blocks up)."""
    book = TenantBook({"c": TenantSettings(max_kv_blocks=8)})
    driver = Driver(TWO_SEATS, tenants=book)
    driver.add(request("k", "c", prompt=8, out=30))
    driver.add(request("r", "c", prompt=8, out=30, first=40))
    _run(driver, 3)  # 11 tokens each: 3 blocks each
    k, r = driver.scheduler.requests["k"], driver.scheduler.requests["r"]
    assert driver.scheduler.pause(k) and k.seq_id is not None  # 3 + 3 <= 8
    _run(driver, 7)  # r holds 5 blocks: 5 + 3 <= 8
    assert k.seq_id is not None and len(driver.blocks.block_table(r.seq_id or 0)) == 5
    _run(driver, 5)  # r grew to 6 blocks (6 + 3 > 8): the next plan freed the kept one
    assert k.seq_id is None and driver.scheduler.num_kept_kv_blocks == 0
    assert r.state is RequestState.RUNNING and _preempted(driver) == []
    assert driver.scheduler.pause_counts.num_kept_dropped == 1


def test_max_paused_kv_fraction_is_checked() -> None:
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="max_paused_kv_fraction"):
            dataclasses.replace(ONE_SEAT, max_paused_kv_fraction=bad)


def test_check_integrity_names_a_sequence_held_out_of_the_batch_unkept() -> None:
    """The check can fail: a paused request holding a sequence the book does not keep."""
    driver = Driver(dataclasses.replace(ONE_SEAT, max_paused_kv_fraction=0.0))
    driver.add(request("s", "t", prompt=8, out=10))
    _run(driver, 2)
    s = driver.scheduler.requests["s"]
    seq_id = s.seq_id
    assert driver.scheduler.pause(s)
    s.seq_id = seq_id  # as if the pause had left it its sequence without keeping it
    with pytest.raises(CacheIntegrityError, match="kept requests"):
        driver.scheduler.check_integrity()


OPS = ("add", "step", "step", "step", "pause", "resume", "abort")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    fraction=st.sampled_from([0.0, 0.25, 1.0]),
    num_blocks=st.integers(12, 40),
)
def test_kept_sequences_stay_bounded_and_leak_nothing(
    seed: int, fraction: float, num_blocks: int
) -> None:
    """Any mix of arrivals, steps, pauses, resumes and cancels (150 drawn by ``seed``): only
    kept requests hold KV out of the batch, within the bound; every request finishes or is
    cancelled with no block left."""
    cfg = SchedulerConfig(
        max_num_seqs=3, max_num_batched_tokens=32, max_model_len=48,
        max_paused_kv_fraction=fraction,
    )  # fmt: skip
    driver = Driver(cfg, num_blocks=num_blocks)
    rng = random.Random(seed)
    for _ in range(150):
        op, i = rng.choice(OPS), rng.randrange(4)
        rid = f"r{i}"
        req = driver.scheduler.requests.get(rid)
        if op == "add" and req is None:
            driver.add(request(rid, f"t{i % 3}", prompt=4 + 5 * i, out=8 + 2 * i, first=30 * i))
        elif op == "step":
            driver.step()
        elif op == "pause" and req is not None:
            driver.scheduler.pause(req)
        elif op == "resume":
            driver.scheduler.resume(rid)
        elif op == "abort" and req is not None:
            driver.scheduler.finish(req, RequestState.ABORTED, FINISH_ABORT)
        driver.scheduler.check_integrity()
        assert driver.scheduler.num_kept_kv_blocks <= int(fraction * num_blocks)
    for rid in list(driver.scheduler.requests):
        driver.scheduler.resume(rid)
    for _ in range(400):
        if not driver.scheduler.requests:
            break
        driver.step()
        driver.scheduler.check_integrity()
    assert driver.scheduler.requests == {} and driver.blocks.usage == 0
