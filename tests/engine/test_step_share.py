"""Per-step work shares (``engine/sched/step_share.py``): a tenant over its seat share whose work
in a step exceeds ``step_work_ratio`` times the next busiest tenant's runs only part of its
sequences that step, longest-waiting first; everyone else, and everyone when the rule is off or
nobody is that busy, runs every sequence every step."""

from __future__ import annotations

from collections import Counter

from sched_kit import Driver, request

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.request import Request, RequestState
from loraplex.engine.sched.step_share import ROW_COST_POSITIONS, StepShares, row_work
from loraplex.sampling import SamplingParams


def _running(rid: str, tenant: str, computed: int, total: int | None = None) -> Request:
    """A RUNNING request with ``computed`` tokens in KV and one more to decode."""
    prompt = total or computed + 1
    engine = EngineRequest(rid, tenant, None, tuple(range(1, prompt + 1)), SamplingParams())
    req = Request(engine, arrival_s=0.0, deadline_at_s=1e9)
    req.transition(RequestState.RUNNING)
    req.num_computed_tokens = computed
    return req


def _shares(ratio: float = 1.0, weights: dict[str, float] | None = None) -> StepShares:
    return StepShares(lambda t: (weights or {}).get(t, 1.0), ratio, 512)


def test_the_busiest_tenant_over_its_share_runs_only_the_next_busiest_tenants_work() -> None:
    hog = [_running(f"h{i}", "hog", 400) for i in range(8)]
    victims = [_running(f"v{i}", "victim", 70) for i in range(2)]
    waiting = _shares().waiting([*hog, *victims], {}, {}, over_share={"hog"})
    allowed = 2 * row_work(70)
    ran = [r for r in hog if r.request_id not in waiting]
    assert sum(row_work(r.num_computed_tokens) for r in ran) <= allowed
    assert len(ran) == allowed // row_work(400)  # as many as fit, no fewer
    assert not waiting & {"v0", "v1"}


def test_within_its_share_or_not_much_busier_nobody_waits() -> None:
    hog = [_running(f"h{i}", "hog", 400) for i in range(8)]
    victims = [_running(f"v{i}", "victim", 70) for i in range(2)]
    assert not _shares().waiting([*hog, *victims], {}, {}, over_share=set())
    even = [_running(f"a{i}", "a", 100) for i in range(3)]
    b = [_running(f"b{i}", "b", 100) for i in range(2)]
    assert not _shares(ratio=2.0).waiting([*even, *b], {}, {}, over_share={"a"})  # 3 <= 2 x 2
    assert _shares(ratio=1.0).waiting([*even, *b], {}, {}, over_share={"a"})


def test_a_lone_tenant_and_the_rule_off_hold_nobody_back() -> None:
    hog = [_running(f"h{i}", "hog", 400) for i in range(8)]
    assert not _shares().waiting(hog, {}, {}, over_share={"hog"})
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, step_work_ratio=0)
    driver = _hog_and_victim(cfg)
    for _ in range(20):
        plan = driver.step()
        assert sum(c.request_id.startswith("hog") for c in plan.chunks) == _held(driver, "hog")


def test_the_first_sequence_always_runs_and_the_longest_waiting_go_first() -> None:
    hog = [_running(f"h{i}", "hog", 400) for i in range(4)]
    victim = [_running("v0", "victim", 1)]
    last_run = {"h0": 5, "h1": 3, "h2": 4, "h3": 5}
    waiting = _shares().waiting([*hog, *victim], {}, last_run, over_share={"hog"})
    assert waiting == {"h0", "h2", "h3"}  # one row (h1, waiting longest) although it is over


def test_a_tenants_weight_scales_what_it_may_do() -> None:
    hog = [_running(f"h{i}", "hog", 0) for i in range(8)]
    victim = [_running("v0", "victim", 0)]
    light = _shares().waiting([*hog, *victim], {}, {}, over_share={"hog"})
    heavy = _shares(weights={"hog": 3.0}).waiting([*hog, *victim], {}, {}, over_share={"hog"})
    assert (len(hog) - len(light), len(hog) - len(heavy)) == (1, 3)


def test_queued_work_counts_for_the_tenant_that_may_start_it() -> None:
    hog = [_running(f"h{i}", "hog", 0) for i in range(8)]
    alone = _shares().waiting(hog, {"victim": 0}, {}, over_share={"hog"})
    assert not alone  # a tenant with nothing to run does not hold anyone back
    queued = _shares().waiting(hog, {"victim": 2 * ROW_COST_POSITIONS}, {}, over_share={"hog"})
    assert len(hog) - len(queued) == 2


def _hog_and_victim(cfg: SchedulerConfig) -> Driver:
    """A hog with long prompts holding many seats, a victim with short ones arriving later."""
    driver = Driver(cfg, num_blocks=4096, block_size=16)
    for i in range(14):
        driver.add(request(f"hog{i}", "hog", prompt=60, out=400, first=100 * i + 1))
    for _ in range(20):  # alone, it takes a seat per step (60-token prompts, 64-token steps)
        driver.step()
    for i in range(3):
        driver.add(request(f"vic{i}", "victim", prompt=4, out=30, first=5000 + i))
    return driver


def _held(driver: Driver, tenant: str) -> int:
    return sum(r.tenant == tenant for r in driver.scheduler.running)


def test_in_the_engine_the_hog_takes_turns_and_the_victim_runs_every_step() -> None:
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, step_work_ratio=1.0)
    driver = _hog_and_victim(cfg)
    ran: Counter[str] = Counter()
    steps = turns = 0
    while any(r.tenant == "victim" for r in driver.scheduler.requests.values()):
        victim_running = {r.request_id for r in driver.scheduler.running if r.tenant == "victim"}
        held_before = _held(driver, "hog")
        plan = driver.step()
        ids = {c.request_id for c in plan.chunks}
        assert victim_running <= ids  # the victim's sequences never wait
        hog_ran = sum(i.startswith("hog") for i in ids)
        assert hog_ran >= 1  # nor does the hog stop
        if victim_running and held_before > 8:  # over its equal share, it takes turns
            assert hog_ran < held_before
            turns += 1
        ran.update(i for i in ids if i.startswith("hog"))
        steps += 1
        assert steps < 500
    assert turns  # the case arose
    hogs = [r for r in driver.scheduler.running if r.tenant == "hog"]
    assert hogs and all(ran[r.request_id] > 0 for r in hogs)  # every held sequence had turns
    assert min(ran[r.request_id] for r in hogs) >= max(ran.values()) // 4  # and even ones


def test_a_held_back_tenant_gives_a_seat_to_a_tenant_owed_one() -> None:
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, step_work_ratio=1.0)
    driver = Driver(cfg, num_blocks=4096, block_size=16)
    for i in range(8):
        driver.add(request(f"hog{i}", "hog", prompt=60, out=400, first=100 * i + 1))
    for _ in range(12):
        driver.step()
    assert _held(driver, "hog") == 8  # alone, it took every seat
    driver.add(request("vic0", "victim", prompt=4, out=30, first=9000))
    plan = driver.step()
    assert "vic0" in {c.request_id for c in plan.chunks}  # seated within the step
    assert plan.preempted  # a hog sequence gave its seat up
