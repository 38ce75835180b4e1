"""KV prefix reuse stays within one tenant. Blocks were keyed by the adapter revision alone, so
the base model's blocks and a public adapter's were shared by every tenant: a tenant whose
prompt found another tenant's cached prefix skipped those tokens, and its shorter time to first
token told it that someone had just sent that prefix (a document, a system prompt) to the base
model or to the public adapter. The same tenant still reuses its own prefixes."""

from __future__ import annotations

from sched_kit import Driver, adapter, request

from loraplex.engine.config import SchedulerConfig


def _drain(driver: Driver) -> None:
    for _ in range(200):
        if not driver.scheduler.requests:
            return
        driver.step()
    raise AssertionError(f"requests left: {driver.scheduler.requests}")


def test_another_tenants_cached_prefix_is_not_reused_its_own_is() -> None:
    driver = Driver(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), block_size=4)
    public = adapter("search", tenant="globex")  # globex's public adapter: acme may call it
    driver.resident.add(public)
    driver.add(request("globex-base", "globex", prompt=10, out=1))
    driver.add(request("globex-public", "globex", prompt=10, out=1, key=public, first=100))
    _drain(driver)
    for rid, tenant in (("acme", "acme"), ("globex", "globex")):
        driver.add(request(f"{rid}-base", tenant, prompt=10, out=1))
        driver.add(request(f"{rid}-public", tenant, prompt=10, out=1, key=public, first=100))
    plan = driver.step()
    starts = {c.request_id: c.start_pos for c in plan.chunks}
    assert starts == {"acme-base": 0, "acme-public": 0, "globex-base": 8, "globex-public": 8}
    driver.blocks.check_integrity()
