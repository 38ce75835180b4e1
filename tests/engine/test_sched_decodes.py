"""``Scheduler.schedule_decodes`` (the simulator's steady-state planner) plans exactly what
``schedule()`` plans wherever it plans at all, and leaves every other state to it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_kit import Driver, adapter, request

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.step import StepPlan, StepResult
from loraplex.engine.tenant_shares import TenantBook, TenantSettings

traffic = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 20),  # prompt tokens
        st.integers(1, 12),  # output tokens
        st.sampled_from([None, "x", "y", "z"]),  # adapter ("z" loads at step 6)
        st.integers(0, 30),  # arrival step
    ),
    min_size=1,
    max_size=20,
)


def _drive(driver: Driver, reqs: list[tuple[str, int, int, str | None, int]]) -> None:
    pending = sorted(enumerate(reqs), key=lambda item: item[1][4])
    for step in range(400):
        while pending and pending[0][1][4] <= step:
            i, (tenant, prompt, out, name, _) = pending.pop(0)
            key = adapter(name) if name else None
            driver.add(request(f"r{i}", tenant, prompt=prompt, out=out, key=key, first=1 + i))
        if step == 6:
            driver.load(adapter("z"))
        if not pending and not driver.scheduler.requests:
            return
        driver.step()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=traffic,
    max_seqs=st.integers(1, 6),
    num_blocks=st.integers(8, 40),
    kv_cap=st.sampled_from([None, 6]),
)
def test_decode_plans_are_the_plans_schedule_makes(
    reqs: list[tuple[str, int, int, str | None, int]],
    max_seqs: int,
    num_blocks: int,
    kv_cap: int | None,
) -> None:
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_seqs + 8,
                          max_model_len=40, default_deadline_s=1e6)  # fmt: skip
    tenants = {"b": TenantSettings(weight=2.0, max_kv_blocks=kv_cap)}
    drivers = [
        Driver(
            cfg,
            num_blocks,
            4,
            resident={adapter("x"), adapter("y")},
            tenants=TenantBook(tenants),
            decodes_first=first,
        )
        for first in (False, True)
    ]
    for driver in drivers:
        _drive(driver, reqs)
    plain, decodes = drivers
    assert decodes.plans == plain.plans
    assert decodes.finished == plain.finished and decodes.expired == plain.expired
    assert plain.num_decode_plans == 0


def test_a_steady_batch_is_planned_by_schedule_decodes_alone() -> None:
    """Two requests decoding side by side: after their prompts every step is a decode plan, also
    while a queued request waits for its adapter to load; a queued request ready to run hands
    planning back to ``schedule()``."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    driver = Driver(cfg, num_blocks=32, resident={adapter("x")}, decodes_first=True)
    driver.add(request("r0", prompt=4, out=6, key=adapter("x")))
    driver.add(request("r1", "b", prompt=4, out=6))
    driver.step()  # both prompts
    assert driver.num_decode_plans == 0
    for _ in range(3):
        plan = driver.step()
        assert [len(c.token_ids) for c in plan.chunks] == [1, 1]
    assert driver.num_decode_plans == 3
    driver.add(request("r2", prompt=4, out=2, key=adapter("cold")))
    driver.step()
    assert driver.num_decode_plans == 4
    driver.add(request("r3", "c", prompt=4, out=2))  # the base model: ready at once
    plan = driver.step()
    assert driver.num_decode_plans == 4 and "r3" in {c.request_id for c in plan.chunks}


def _steady_pair(
    *arrivals: list[tuple[str, int]], work_ratio: float = 1.0
) -> tuple[Driver, Driver, StepPlan]:
    """Two identical drivers past their prompts (each list of (tenant, prompt tokens) arrives
    at one step), each with the same steady decode plan made."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64,
                          step_work_ratio=work_ratio)  # fmt: skip
    drivers = []
    for _ in range(2):
        driver = Driver(cfg, num_blocks=40, decodes_first=True)
        for group in arrivals:
            for tenant, prompt in group:
                i = len(driver.scheduler.requests)
                driver.add(request(f"r{i}", tenant, prompt=prompt, out=30, first=1 + 50 * i))
            driver.step()  # their prompts
        drivers.append(driver)
    plans = [d.scheduler.schedule_decodes() for d in drivers]
    assert plans[0] is not None and plans[0] == plans[1]
    return drivers[0], drivers[1], plans[0]


def _inner_state(driver: Driver) -> object:
    """What a later plan may read besides the requests (NOTE: private fields on purpose: the
    bulk path must leave each of them as the rounds one by one do)."""
    sched, blocks = driver.scheduler, driver.blocks
    requests = [(r.request_id, r.num_computed_tokens, list(r.output_token_ids), r.seq_id)
                for r in sched.running]  # fmt: skip
    tables = [list(blocks.block_table(r.seq_id or 0)) for r in sched.running]
    return (
        requests,
        tables,
        dict(sched._queues._vtime),
        dict(sched._last_run),
        sched._step,
        sorted(blocks._block_of.items()),
        list(blocks._free),
    )


def test_advance_decodes_leaves_what_stepping_one_by_one_leaves() -> None:
    """``advance_decodes(plan, token, k)`` against k rounds of ``update`` and
    ``schedule_decodes``: the same last plan, and every later plan of both drivers the same
    (blocks, virtual times and last-run steps all carry into them)."""
    stepped, bulk, plan = _steady_pair([("a", 3), ("b", 6), ("c", 9)])
    one = plan
    for _ in range(9):  # crosses block boundaries (block_size 4)
        stepped.scheduler.update(one, StepResult(dict.fromkeys(stepped.scheduler.requests, 7), {}))
        following = stepped.scheduler.schedule_decodes()
        assert following is not None
        one = following
    assert bulk.scheduler.advance_decodes(plan, 7, 9) == one
    assert _inner_state(bulk) == _inner_state(stepped)
    for driver in (stepped, bulk):
        driver.scheduler.update(one, StepResult(dict.fromkeys(driver.scheduler.requests, 7), {}))
        driver.add(request("late", "d", prompt=5, out=4, first=900))
        for _ in range(40):
            if driver.scheduler.requests:
                driver.step()
    assert bulk.plans[1:] == stepped.plans[1:] and bulk.finished == stepped.finished
    assert len(bulk.finished) == 4
    assert bulk.blocks.num_free == stepped.blocks.num_free


def test_advance_decodes_declines_where_a_round_could_plan_otherwise() -> None:
    # A tenant over its equal share (4 of 8 seats each): the step-share rule could hold it back
    # once its contexts grow (not yet: its work is within 10x the other's, so a plan is made).
    _, over, plan = _steady_pair([("a", 3)] * 5, [("b", 4)], work_ratio=10.0)
    assert len(over.scheduler.running) == 6
    before = [(r.num_computed_tokens, list(r.output_token_ids)) for r in over.scheduler.running]
    assert over.scheduler.advance_decodes(plan, 7, 3) is None
    after = [(r.num_computed_tokens, list(r.output_token_ids)) for r in over.scheduler.running]
    assert after == before
    # A queued request ready to run, and a plan that is not the running batch's decode step.
    _, ready, plan = _steady_pair([("a", 3), ("b", 4)])
    ready.add(request("new", "c", prompt=4, out=2, first=700))
    assert ready.scheduler.advance_decodes(plan, 7, 3) is None
    _, other, plan = _steady_pair([("a", 3), ("b", 4)])
    assert other.scheduler.advance_decodes(StepPlan(plan.chunks[:1], ()), 7, 3) is None
    assert other.scheduler.advance_decodes(plan, 7, 0) is None
    assert other.scheduler.advance_decodes(plan, 7, 2) is not None
