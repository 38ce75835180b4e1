"""The scheduler's admission through its own lease methods: the cold-load quota (hits free,
prefetches counted), lease failures, leases released on finish, and the published view."""

from __future__ import annotations

from sched_kit import Driver, adapter, request

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import FINISH_ABORT
from loraplex.engine.request import RequestState
from loraplex.engine.sched.admission import AdapterLoads
from loraplex.engine.tenant_shares import TenantBook, TenantSettings
from loraplex.errors import AdapterError, CapacityError, QueueTimeoutError

QUOTA = TenantBook({"storm": TenantSettings(max_cold_loads=2)})


def _awaited(driver: Driver, tenant: str) -> set[str]:
    return {
        r.request_id
        for r in driver.scheduler.requests.values()
        if r.tenant == tenant and r.state is RequestState.ADAPTER_WAIT
    }


def test_a_tenant_loads_at_most_its_cold_load_quota_and_hits_are_free() -> None:
    hot = adapter("hot", "storm")
    driver = Driver(SchedulerConfig(lease_lookahead=16), resident={hot}, tenants=QUOTA)
    driver.add(request("hot", "storm", key=hot))
    for i in range(4):
        driver.add(request(f"c{i}", "storm", key=adapter(f"c{i}", "storm")))
    for i in range(3):
        driver.add(request(f"x{i}", "calm", key=adapter(f"x{i}", "calm")))
    asked = {r.request_id for r in driver.grant_leases()}
    assert asked == {"hot", "c0", "c1", "x0", "x1", "x2"}  # the hit took no quota
    assert driver.scheduler.requests["hot"].lease is not None
    assert _awaited(driver, "storm") == {"c0", "c1"}
    assert _awaited(driver, "calm") == {"x0", "x1", "x2"}  # quotas are per tenant
    driver.load(adapter("c0", "storm"))
    c0 = driver.scheduler.requests["c0"]
    assert c0.state is RequestState.WAITING and c0.lease is not None
    assert [r.request_id for r in driver.grant_leases()] == ["c2"]  # c0's load freed a place
    assert _awaited(driver, "storm") == {"c1", "c2"}


def test_prefetches_count_against_the_cold_load_quota() -> None:
    hot = adapter("hot", "storm")
    driver = Driver(SchedulerConfig(), resident={hot}, tenants=QUOTA)
    driver.add(request("c0", "storm", key=adapter("c0", "storm")))
    driver.grant_leases()  # c0 now loads: one of storm's two
    p0, p1 = adapter("p0", "storm"), adapter("p1", "storm")
    loads = AdapterLoads(driver.resident.__contains__, {p0: "storm"})  # p0 is prefetching
    admitted = driver.scheduler.admit_prefetches({p1: "storm", p0: "storm", hot: "storm"}, loads)
    assert admitted == [p0, hot]  # joining p0's load and a hit are free; p1 would be a third
    calm = {adapter(f"q{i}", "calm"): "calm" for i in range(5)}
    assert driver.scheduler.admit_prefetches(calm, loads) == list(calm)  # no quota: all
    public = {adapter(f"p{i}", "storm"): "calm" for i in range(2, 5)}  # calm's calls of storm's
    assert driver.scheduler.admit_prefetches(public, loads) == list(public)  # calm's: no quota


def test_a_callers_cold_loads_of_public_adapters_count_for_the_caller() -> None:
    """A request's cold load counts for the request's tenant (the one the cache charges): a
    caller's calls of another tenant's public adapters use the caller's quota, never the
    owner's (counted for the owner, the owner's own cold request was passed over)."""
    quota = TenantBook({"globex": TenantSettings(max_cold_loads=1)})
    driver = Driver(SchedulerConfig(lease_lookahead=16), tenants=quota)
    for i in range(3):
        driver.add(request(f"pub{i}", "acme", key=adapter(f"search{i}", "globex")))
    driver.add(request("own", "globex", key=adapter("codegen", "globex")))
    driver.add(request("own2", "globex", key=adapter("summarize", "globex")))
    asked = {r.request_id for r in driver.grant_leases()}
    assert asked == {"pub0", "pub1", "pub2", "own"}  # globex's second waits for its one
    capped = TenantBook({"acme": TenantSettings(max_cold_loads=1)})
    driver = Driver(SchedulerConfig(lease_lookahead=16), tenants=capped)
    for i in range(2):
        driver.add(request(f"pub{i}", "acme", key=adapter(f"search{i}", "globex")))
    asked = {r.request_id for r in driver.grant_leases()}
    assert asked == {"pub0"}  # acme's second public load waits for acme's quota


def test_a_failed_lease_ends_its_request_with_a_queue_timeout_only_past_its_deadline() -> None:
    cfg = SchedulerConfig(retry_hint_s=3.0)
    driver = Driver(cfg)
    driver.add(request("r", key=adapter("cold"), deadline_s=1.0))
    driver.grant_leases()
    req = driver.scheduler.requests["r"]
    assert req.state is RequestState.ADAPTER_WAIT
    early = CapacityError("no slot")
    assert driver.scheduler.on_lease_failed(req, early) is early
    driver.clock.advance(2.0)
    late = driver.scheduler.on_lease_failed(req, CapacityError("no slot"))
    assert isinstance(late, QueueTimeoutError) and late.retry_after_s == 3.0
    corrupt = AdapterError("bad adapter")
    assert driver.scheduler.on_lease_failed(req, corrupt) is corrupt  # not a capacity failure


def test_finishing_a_request_releases_its_lease() -> None:
    key = adapter("warm")
    driver = Driver(SchedulerConfig(max_num_seqs=1), resident={key})
    driver.add(request("runs", key=key, out=2))
    driver.add(request("queued", key=key))
    driver.grant_leases()
    assert len(driver.leases) == 2 and not any(lease.released for lease in driver.leases)
    queued = driver.scheduler.requests["queued"]
    driver.scheduler.finish(queued, RequestState.ABORTED, FINISH_ABORT)
    assert queued.lease is None and driver.leases[1].released
    while "runs" in driver.scheduler.requests:
        driver.step()
    assert driver.leases[0].released


def test_make_stats_counts_queued_running_and_awaited_adapters() -> None:
    warm, cold, other = adapter("warm"), adapter("cold"), adapter("other")
    driver = Driver(SchedulerConfig(max_num_seqs=2), resident={warm})
    driver.add(request("base"))
    driver.add(request("warm", key=warm))
    for rid, key in (("cold1", cold), ("cold2", cold), ("other", other)):
        driver.add(request(rid, key=key))
    driver.grant_leases()
    view = driver.scheduler.make_stats()
    assert (view.num_waiting, view.num_adapter_wait, view.num_running) == (2, 3, 0)
    assert view.queued_adapters == (cold, other) and view.kv_usage == 0
    driver.scheduler.schedule()
    view = driver.scheduler.make_stats()
    assert (view.num_waiting, view.num_adapter_wait, view.num_running) == (0, 3, 2)
    assert view.kv_usage > 0


def test_make_stats_lists_the_adapters_of_running_and_of_queued_requests_as_vllm_does() -> None:
    """``vllm:lora_requests_info``'s lists (vLLM's LoRARequestStates): an adapter with a
    running request, and one with a queued request, leased or not; one with both is in both,
    and the base model in neither. They listed GPU slots (an idle resident adapter included)."""
    warm, cold, idle = adapter("warm"), adapter("cold"), adapter("idle")
    driver = Driver(SchedulerConfig(max_num_seqs=2), resident={warm, idle})
    driver.add(request("base"))
    driver.add(request("warm1", key=warm))
    driver.add(request("warm2", key=warm))  # no seat left: queued, its adapter leased
    driver.add(request("cold", key=cold))
    driver.grant_leases()
    view = driver.scheduler.make_stats()
    assert view.lora_running == () and view.lora_waiting == (warm, cold)
    driver.scheduler.schedule()
    view = driver.scheduler.make_stats()
    assert view.num_running == 2 and view.lora_running == (warm,)  # base and warm1
    assert view.lora_waiting == (warm, cold)  # warm2 and cold: warm is in both lists
    assert idle not in view.lora_running + view.lora_waiting
