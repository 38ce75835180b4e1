"""The typed messages between the server and its engine process, through a real child: the
loading cache commands (prefetch, a warm policy) answer at once and report their load later,
the published state follows residency and counters without a call, an idle child publishes
nothing, and /metrics reads the published counters."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
from live import Live, live_server
from prometheus_client.parser import text_string_to_metric_families

from loraplex.demo.assets import DemoAssets
from loraplex.engine.transport.process import EngineProcess
from loraplex.residency.ledger import Tier

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _engine(live: Live) -> EngineProcess:
    engine = live.server.engine
    assert isinstance(engine, EngineProcess)
    return engine


def _until(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _metric(http: httpx.Client, name: str, tier: str) -> float:
    text = http.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("tier") == tier:
                return sample.value
    raise AssertionError(f"{name}{{tier={tier}}} not in /metrics")


def test_cache_commands_and_published_state_cross_the_pipe(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    # Not a tenant's core adapter (acme/support@r1 and the like): the demo bootstrap pins those
    # in host memory with a `cpu` warm policy, so an eviction from L1 would be refused.
    first, second = demo_assets.adapters[2], demo_assets.adapters[1]
    with live_server(demo_assets, tmp_path, admin_key=ADMIN, max_loras=4) as live:
        engine, registry = _engine(live), live.server.registry
        http = httpx.Client(base_url=live.url, headers=AUTH, timeout=60)
        ref = f"{first.tenant}/{first.name}@{first.revision}"
        key = registry.get_revision(ref).key()

        fetch = {"model": ref, "tier": "L1", "wait": True}  # Prefetch, then LoadDone
        assert http.post("/admin/residency/prefetch", json=fetch).json()["status"] == "resident"
        _until(lambda: engine.cache.is_resident(key, Tier.L1), "published residency")
        loads = engine.cache.summary().stats.loads[Tier.L1]
        assert loads >= 1
        assert _metric(http, "adapter_loads_total", "L1") == loads  # /metrics: the published one

        path = f"/admin/revisions/{second.tenant}/{second.name}/{second.revision}"
        assert http.put(path, json={"warm_policy": "gpu"}).status_code == 200  # SetWarm
        warm = registry.get_revision(f"{second.tenant}/{second.name}@{second.revision}").key()
        _until(lambda: engine.cache.is_resident(warm, Tier.L0), "warm policy load")
        _until(lambda: warm in engine.load_snapshot().running_adapters, "published slots")

        evict = {"model": ref, "tier": "L1"}  # Evict: the delta removes the copy here too
        assert http.post("/admin/residency/evict", json=evict).json()["evicted"] is True
        _until(lambda: not engine.cache.is_resident(key, Tier.L1), "eviction delta")

        deprecate = http.put(
            f"/admin/revisions/{ref.replace('@', '/')}", json={"state": "deprecated"}
        )
        assert deprecate.status_code == 200, deprecate.text  # DropAutoWarm ran in the child

        _until(lambda: _quiet(engine), "an idle engine kept publishing its state")


def _quiet(engine: EngineProcess) -> bool:
    """No state publish for 0.5 s (25 publish intervals): nothing changed, nothing was sent."""
    before = engine.num_state_updates
    time.sleep(0.5)
    return engine.num_state_updates == before
