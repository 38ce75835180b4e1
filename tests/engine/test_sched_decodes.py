"""``Scheduler.schedule_decodes`` (the simulator's steady-state planner) plans exactly what
``schedule()`` plans wherever it plans at all, and leaves every other state to it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_kit import Driver, adapter, request

from loraplex.engine.config import SchedulerConfig
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
