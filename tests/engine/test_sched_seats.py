"""Per-tenant seats: fair seat shares (work-conserving), reservations, ``max_running_seqs`` and
``max_kv_blocks`` as invariants, and ``n`` siblings each counted as a seat."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_kit import Driver, request

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import RequestState
from loraplex.engine.sched.seats import MIN_SEATS_FOR_HEADROOM, fair_seats
from loraplex.engine.tenant_shares import SeatLimits, TenantBook, TenantSettings
from loraplex.sampling import SamplingParams

SEATS = 32
LONG = 200  # output tokens of a hog's request ("max_tokens 480" shrunk to fit max_model_len)


def _config(max_num_seqs: int = SEATS) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=1024,
        max_model_len=256,
        default_deadline_s=1e6,
    )


def _running(driver: Driver) -> Counter[str]:
    return Counter(r.tenant for r in driver.scheduler.running)


def _hog(driver: Driver, count: int = 40, start: int = 0) -> None:
    for i in range(start, start + count):
        driver.add(request(f"hog{i}", "hog", prompt=8, out=LONG, first=1 + i))


def test_a_lone_tenant_uses_every_seat() -> None:
    driver = Driver(_config(), num_blocks=4096)
    _hog(driver)
    driver.step()
    assert _running(driver)["hog"] == SEATS


def test_a_hogs_long_requests_leave_a_seat_for_another_tenant_within_one_step() -> None:
    driver = Driver(_config(), num_blocks=4096)
    _hog(driver)
    for _ in range(5):
        driver.step()
    assert _running(driver)["hog"] == SEATS  # every seat taken by long generations
    driver.add(request("victim", "victim", prompt=8, out=4, first=500))
    plan = driver.step()
    assert driver.scheduler.requests["victim"].state is RequestState.RUNNING
    assert any(c.request_id == "victim" for c in plan.chunks)
    assert len(plan.preempted) == 1 and plan.preempted[0].startswith("hog")
    assert _running(driver) == {"hog": SEATS - 1, "victim": 1}
    for _ in range(5):  # the victim finishes; the hog takes its seat back
        driver.step()
    assert "victim" in driver.finished
    assert _running(driver) == {"hog": SEATS}


def test_while_another_tenant_is_active_the_hog_leaves_its_equal_share_free() -> None:
    """A hog that retook every freed seat made each arrival of another tenant a preemption
    (and a recompute of a long sequence), and ran every seat's decode in the steps the other
    tenant's requests waited on; past its equal share it now leaves the other active tenants'
    unclaimed equal shares free, so a burst up to that size starts without preempting."""
    equal = SEATS // 2
    driver = Driver(_config(), num_blocks=8192)
    driver.add(request("resident", "victim", prompt=8, out=LONG, first=900))  # stays active
    driver.step()
    _hog(driver, 60)
    for _ in range(3):
        driver.step()
    assert _running(driver) == {"hog": equal, "victim": 1}
    burst = equal - 1  # the victim's unclaimed seats
    for i in range(burst):
        driver.add(request(f"burst{i}", "victim", prompt=8, out=4, first=950 + i))
    plan = driver.step()
    assert plan.preempted == ()
    assert _running(driver) == {"hog": equal, "victim": equal}
    for _ in range(8):  # the burst ends; the hog does not grow into the victim's share
        driver.step()
    assert all(f"burst{i}" in driver.finished for i in range(burst))
    assert _running(driver) == {"hog": equal, "victim": 1}


def test_with_three_tenants_the_hog_keeps_to_what_the_others_leave_of_their_shares() -> None:
    driver = Driver(_config(), num_blocks=8192)
    for tenant in ("a", "b"):  # two light tenants, one long request each
        driver.add(request(f"{tenant}0", tenant, prompt=8, out=LONG, first=900))
    driver.step()
    _hog(driver, 60)
    for _ in range(3):
        driver.step()
    equal = SEATS // 3
    assert _running(driver) == {"hog": SEATS - 2 - 2 * (equal - 1), "a": 1, "b": 1}


def test_the_hog_grows_back_when_the_others_leave() -> None:
    driver = Driver(_config(), num_blocks=8192)
    driver.add(request("short", "victim", prompt=8, out=2, first=900))
    driver.step()
    _hog(driver, 60)
    for _ in range(6):
        driver.step()
    assert "short" in driver.finished
    assert _running(driver) == {"hog": SEATS}


def test_headroom_caps_only_with_two_active_tenants_and_eight_seats() -> None:
    assert MIN_SEATS_FOR_HEADROOM == 8
    driver = Driver(_config(max_num_seqs=7), num_blocks=4096)
    driver.add(request("resident", "victim", prompt=8, out=LONG, first=900))
    driver.step()
    _hog(driver, 20)
    driver.step()
    assert _running(driver) == {"hog": 6, "victim": 1}


def test_a_freed_seat_goes_to_the_waiting_tenant_not_the_hog() -> None:
    """Even without preemption (the victim arrives when a seat is free), the hog's queued
    requests never take the seat another tenant is waiting for."""
    driver = Driver(_config(max_num_seqs=4), num_blocks=4096)
    _hog(driver, 3)
    driver.step()
    _hog(driver, 10, start=3)
    driver.add(request("victim", "victim", prompt=8, out=4, first=500))
    driver.step()
    assert driver.scheduler.requests["victim"].state is RequestState.RUNNING
    assert _running(driver) == {"hog": 3, "victim": 1}


def test_a_reserved_tenant_gets_its_reserved_seats_within_one_step() -> None:
    book = TenantBook({"v": TenantSettings(reserved_running_seqs=4)})
    reserved = Driver(_config(max_num_seqs=8), num_blocks=4096, tenants=book)
    plain = Driver(_config(max_num_seqs=8), num_blocks=4096)
    for driver in (reserved, plain):
        for hog in ("h1", "h2"):
            for i in range(10):
                driver.add(request(f"{hog}-{i}", hog, prompt=8, out=LONG, first=1 + i))
        driver.step()
        driver.step()
        for i in range(6):
            driver.add(request(f"v{i}", "v", prompt=8, out=LONG, first=100 + i))
        driver.step()
    assert _running(reserved)["v"] == 4  # its reservation, ahead of the hogs' fair shares
    assert _running(plain)["v"] == 2  # its fair share: 8 seats over 3 tenants (ties by name)
    assert sum(_running(reserved).values()) == 8


def test_an_idle_reservation_keeps_no_seat_empty() -> None:
    book = TenantBook({"v": TenantSettings(reserved_running_seqs=4)})
    driver = Driver(_config(max_num_seqs=8), num_blocks=4096, tenants=book)
    _hog(driver, 12)
    driver.step()
    assert _running(driver)["hog"] == 8  # work-conserving: v is not here


def _siblings(tenant: str, count: int, first: int) -> list[EngineRequest]:
    """``n`` = ``count``: one engine request per sibling, followers naming the leader."""
    prompt = tuple(range(first, first + 8))
    params = SamplingParams(max_tokens=LONG)
    leader = f"{tenant}-0"
    return [
        EngineRequest(
            f"{tenant}-{i}", tenant, None, prompt, params, prefix_leader=None if i == 0 else leader
        )
        for i in range(count)
    ]


def test_n_siblings_each_take_a_seat_and_yield_like_any_sequence() -> None:
    driver = Driver(_config(max_num_seqs=8), num_blocks=4096)
    for sibling in _siblings("fan", 16, first=1):
        driver.add(sibling)
    driver.step()
    driver.step()
    assert _running(driver)["fan"] == 8  # siblings are seats: 8 of its 16 run
    driver.add(request("victim", "victim", prompt=8, out=4, first=500))
    driver.step()
    assert _running(driver) == {"fan": 7, "victim": 1}


def test_max_running_seqs_caps_a_tenant_even_alone() -> None:
    book = TenantBook({"capped": TenantSettings(max_running_seqs=3)})
    driver = Driver(_config(max_num_seqs=8), num_blocks=4096, tenants=book)
    for i in range(10):
        driver.add(request(f"c{i}", "capped", prompt=8, out=20, first=1 + i))
    for _ in range(6):
        driver.step()
        assert _running(driver)["capped"] == 3


def test_max_kv_blocks_caps_a_tenants_blocks_but_never_starves_a_request() -> None:
    # block_size 4: a 9-token prompt takes 3 blocks, its 6 outputs one or two more.
    book = TenantBook({"kv": TenantSettings(max_kv_blocks=8)})
    driver = Driver(_config(max_num_seqs=8), num_blocks=256, tenants=book)
    driver.add(request("big", "kv", prompt=60, out=4, first=1))  # 16 blocks: over, but alone
    for i in range(6):
        driver.add(request(f"s{i}", "kv", prompt=9, out=6, first=100 + i))
    driver.step()
    assert _running(driver)["kv"] == 1  # big runs alone past the cap; nothing joins it
    for _ in range(60):
        if not driver.scheduler.requests:
            break
        driver.step()
        if _running(driver)["kv"] > 1:
            assert _held_blocks(driver)["kv"] <= 8
    assert sorted(driver.finished) == sorted(["big", *(f"s{i}" for i in range(6))])


def _held_blocks(driver: Driver) -> Counter[str]:
    held: Counter[str] = Counter()
    for r in driver.scheduler.running:
        assert r.seq_id is not None
        held[r.tenant] += len(driver.blocks.block_table(r.seq_id))
    return held


def test_fair_seats_is_weighted_max_min_and_hands_out_every_usable_seat() -> None:
    weights = {"a": 1.0, "b": 1.0, "high": 4.0}
    demand = {"a": 100, "b": 2, "high": 100}
    shares = fair_seats(weights, demand, {}, {}, 32)
    assert shares == {"a": 6, "b": 2, "high": 24}  # b's unused share goes to the others
    assert fair_seats(weights, demand, {"a": 10}, {"high": 5}, 32) == {"a": 25, "b": 2, "high": 5}
    assert fair_seats({"a": 1.0}, {"a": 3}, {}, {}, 32) == {"a": 3}


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_running_seqs": 0}, "max_running_seqs 0 is invalid"),
        ({"reserved_running_seqs": -1}, "reserved_running_seqs -1 is invalid"),
        ({"max_running_seqs": 2, "reserved_running_seqs": 3}, "expected <= max_running_seqs 2"),
        ({"max_kv_blocks": 0}, "max_kv_blocks 0 is invalid"),
    ],
)
def test_invalid_seat_limits_are_refused_naming_the_field(
    limits: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SeatLimits(**limits)
    with pytest.raises(ValueError, match=message):
        TenantSettings(**limits)


tenant_limits = st.fixed_dictionaries(
    {
        "max_running_seqs": st.none() | st.integers(2, 4),
        "reserved_running_seqs": st.integers(0, 2),  # never above max_running_seqs
        "max_kv_blocks": st.none() | st.integers(1, 16),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limits=st.lists(tenant_limits, min_size=3, max_size=3),
    reqs=st.lists(
        st.tuples(
            st.sampled_from("abc"), st.integers(1, 30), st.integers(1, 12), st.integers(0, 30)
        ),
        min_size=1,
        max_size=30,
    ),
    max_seqs=st.integers(1, 6),
    num_blocks=st.integers(11, 60),
)
def test_seat_and_kv_caps_hold_and_every_request_finishes(
    limits: list[dict[str, int | None]],
    reqs: list[tuple[str, int, int, int]],
    max_seqs: int,
    num_blocks: int,
) -> None:
    book = TenantBook({t: TenantSettings(**lim) for t, lim in zip("abc", limits, strict=True)})  # type: ignore[arg-type]
    cfg = SchedulerConfig(
        max_num_seqs=max_seqs, max_num_batched_tokens=64, max_model_len=44, default_deadline_s=1e6
    )
    driver = Driver(cfg, num_blocks=num_blocks, tenants=book)
    pending = sorted(enumerate(reqs), key=lambda item: item[1][3])
    step = 0
    while pending or driver.scheduler.requests:
        while pending and pending[0][1][3] <= step:
            i, (tenant, prompt, out, _) = pending.pop(0)
            driver.add(request(f"r{i}", tenant, prompt=prompt, out=out, first=1 + i))
        driver.step()
        running, held = _running(driver), _held_blocks(driver)
        for tenant in "abc":
            cap_seqs = book.get(tenant).max_running_seqs
            assert cap_seqs is None or running[tenant] <= cap_seqs
            cap_blocks = book.get(tenant).max_kv_blocks
            assert cap_blocks is None or running[tenant] <= 1 or held[tenant] <= cap_blocks
        assert len(driver.scheduler.running) <= max_seqs
        driver.blocks.check_integrity()
        step += 1
        assert step < 3000, "scheduler made no progress"
    assert sorted(driver.finished) == sorted(f"r{i}" for i in range(len(reqs)))


def test_seat_limits_cross_the_engine_process_pipe() -> None:
    """The child's scheduler gets the same settings: ``UpdateTenants`` goes through a
    ``multiprocessing`` pipe (pickled) with every field of ``TenantSettings``."""
    import multiprocessing

    from loraplex.engine.transport.messages import UpdateTenants

    limits = SeatLimits(max_running_seqs=6, reserved_running_seqs=2, max_kv_blocks=90)
    sent = UpdateTenants({"fan": TenantSettings.for_priority("high", seats=limits)})
    here, there = multiprocessing.Pipe()
    here.send(sent)
    received = there.recv()
    assert received == sent
    fan = received.settings["fan"]
    assert (fan.weight, fan.max_running_seqs, fan.reserved_running_seqs, fan.max_kv_blocks) == (
        4.0,
        6,
        2,
        90,
    )


def test_no_sequence_is_preempted_for_a_seat_its_class_cap_forbids() -> None:
    """A batch tenant's fair share may exceed what its class may run while a higher class
    queues; the seat it cannot take is not owed to it, so nobody is preempted for it."""
    book = TenantBook({"batch": TenantSettings.for_priority("batch")})
    driver = Driver(_config(max_num_seqs=8), num_blocks=4096, tenants=book)
    for i in range(10):
        driver.add(request(f"n{i}", "normal", prompt=8, out=LONG, first=1 + i))
    driver.add(request("b0", "batch", prompt=8, out=LONG, first=50))
    driver.step()
    for i in range(1, 10):
        driver.add(request(f"b{i}", "batch", prompt=8, out=LONG, first=50 + i))
    for _ in range(20):
        driver.step()
    assert _running(driver) == {"normal": 7, "batch": 1}  # the class cap: 8 - 10 queued - 2, >= 1
    assert not any(plan.preempted for plan in driver.plans)


def test_a_higher_class_request_preempts_a_lower_class_that_filled_every_seat() -> None:
    book = TenantBook({"batch": TenantSettings.for_priority("batch")})
    driver = Driver(_config(max_num_seqs=8), num_blocks=4096, tenants=book)
    for i in range(12):
        driver.add(request(f"b{i}", "batch", prompt=8, out=LONG, first=1 + i))
    driver.step()
    assert _running(driver) == {"batch": 8}  # alone, a lower class uses every seat
    driver.add(request("n0", "normal", prompt=8, out=LONG, first=50))
    plan = driver.step()
    assert plan.preempted == ("b7",)  # the newest batch sequence, and only as many as owed
    assert _running(driver) == {"batch": 7, "normal": 1}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 24), st.integers(1, 20)),
        min_size=1,
        max_size=16,
    )
)
def test_a_backlogged_hog_never_grows_into_another_active_tenants_equal_share(
    arrivals: list[tuple[int, int, int]],
) -> None:
    """Property: whenever the victim was active before a step, the hog grows in that step only
    up to what leaves the victim its equal share (or what it holds, if more); every request
    still finishes (the caps never starve anyone)."""
    driver = Driver(_config(max_num_seqs=16), num_blocks=4096)
    for i in range(24):  # a backlog: more long requests than seats
        driver.add(request(f"hog{i}", "hog", prompt=8, out=40, first=1 + i))
    pending = sorted(enumerate(arrivals), key=lambda item: item[1][0])
    equal, step = 8, 0
    while pending or driver.scheduler.requests:
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, out) = pending.pop(0)
            driver.add(request(f"v{i}", "victim", prompt=prompt, out=out, first=1000 + i))
        before = _running(driver)
        victim_active = any(r.tenant == "victim" for r in driver.scheduler.requests.values())
        driver.step()
        after = _running(driver)
        if victim_active and after["hog"] > before["hog"]:
            assert after["hog"] <= max(equal, 16 - max(equal, after["victim"]))
        driver.blocks.check_integrity()
        step += 1
        assert step < 5000, "scheduler made no progress"
    assert sum(name.startswith("v") for name in driver.finished) == len(arrivals)


def test_equal_shares_are_remembered_only_while_the_tenants_and_their_settings_stay() -> None:
    """``FairQueues.equal_shares`` answers from memory while the active tenants and the book's
    settings are the same; a tenant coming or going, a ``TenantBook.replace`` or another seat
    count gives the shares computed afresh."""
    from loraplex.engine.request import Request
    from loraplex.engine.sched.fair_order import FairQueues

    def fresh(queues: FairQueues, seats: int) -> dict[str, int]:
        weights = {t: queues.weight(t) for t in queues.active_tenants()}
        total = sum(weights.values())
        return {t: int(seats * w / total) for t, w in weights.items()}

    book = TenantBook()
    queues = FairQueues(book)

    def add(rid: str, tenant: str) -> Request:
        req = Request(request(rid, tenant), arrival_s=0.0, deadline_at_s=1e6)
        queues.push(req)
        return req

    first = add("x0", "a")
    assert queues.equal_shares(SEATS) == fresh(queues, SEATS) == {"a": SEATS}
    second = add("x1", "b")
    assert queues.equal_shares(SEATS) == fresh(queues, SEATS) == {"a": 16, "b": 16}
    book.replace({"b": TenantSettings.for_priority("high")})
    assert queues.equal_shares(SEATS) == fresh(queues, SEATS) == {"a": 6, "b": 25}
    assert queues.equal_shares(10) == fresh(queues, 10) == {"a": 2, "b": 8}
    queues.remove(second)
    queues.forget_if_idle("b", running=False)
    assert queues.equal_shares(10) == fresh(queues, 10) == {"a": 10}
    queues.remove(first)
    queues.forget_if_idle("a", running=True)  # still running: stays active
    assert queues.equal_shares(10) == {"a": 10}
