"""The simulator's caches share the automatic GPU pins between tenants as a server's do: its
cache settings (``sim/engine_settings.cache_config``) carry the GPU tier's
``default_tenant_tier_share``, which the cache's pin book applies to the seats."""

from __future__ import annotations

import hashlib

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.clock import ManualClock
from loraplex.residency.cache.jobs import JobTable
from loraplex.residency.cache.tier_state import TierState
from loraplex.residency.policy import make_policy
from loraplex.sim.config import SimConfig
from loraplex.sim.engine_settings import cache_config


def _key(tenant: str, name: str) -> AdapterKey:
    digest = hashlib.sha256(f"{tenant}/{name}".encode()).hexdigest()
    return AdapterKey("a" * 64, tenant, name, "r1", digest)


def test_the_simulated_cache_shares_automatic_gpu_pins_between_tenants() -> None:
    config = SimConfig(max_loras=8)  # two automatic GPU seats, a tenant's share 0.5 as served
    assert (config.auto_gpu_slots, config.default_tenant_tier_share) == (2, 0.5)
    cache = cache_config(config)
    clock = ManualClock(0.0)
    jobs = JobTable(cache.max_concurrent_loads, cache.tenant_max_concurrent_loads)
    state = TierState(cache, make_policy("cost_aware"), clock, jobs, lambda tier, k, slot: None)
    hot = [_key("acme", f"hot{i}") for i in range(2)]
    steady = _key("globex", "steady")
    # 3 requests a second on each of acme's, 1 on globex's for 5 minutes: a 5-minute rate of
    # about 1.9 and 0.63 a second (the gpu bar is 0.5)
    for second in range(300):
        for adapter in hot:
            for _ in range(3):
                state.touch(adapter, float(second))
        state.touch(steady, float(second))
    clock.advance(300.0)
    state.rebalance_warm()
    policies = {k: state.pins.warm_policy(k) for k in [*hot, steady]}
    assert policies[steady] is WarmPolicy.GPU  # by rate alone acme's two held both seats
    assert [policies[k] for k in hot].count(WarmPolicy.GPU) == 1
