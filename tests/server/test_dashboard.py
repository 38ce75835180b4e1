"""The fleet page: /admin/fleet for one server (``LocalFleetState``), the dashboard's public static
files and their headers, and which /admin paths stay behind the admin key."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, cast

import httpx
import pytest
import uvicorn
from conftest import ADMIN_KEY, Rig, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient

from loraplex.clock import ManualClock
from loraplex.engine.protocol import EngineHealth, EngineLoad
from loraplex.errors import EngineUnavailableError
from loraplex.residency.cache import CacheSummary
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import CacheStatsSnapshot
from loraplex.router.fleet_state import FleetState, ReplicaState, TierOccupancy
from loraplex.serve.local_fleet import EvictionWindow, LocalFleetState
from loraplex.server.app import create_app
from loraplex.server.auth import DASHBOARD_PATHS, Credential, required_credential
from loraplex.server.listeners import bind_all, guarded
from loraplex.server.routes_dashboard import PAGE_HEADERS

STATIC = {
    "/admin/dashboard": "text/html; charset=utf-8",
    "/admin/dashboard/dashboard.js": "text/javascript; charset=utf-8",
    "/admin/dashboard/chart.js": "text/javascript; charset=utf-8",
    "/admin/dashboard/dashboard.css": "text/css; charset=utf-8",
    "/admin/dashboard/traffic.js": "text/javascript; charset=utf-8",
}
EXPECTED_CSP = "default-src 'self'; script-src 'self'; style-src 'self'"


def test_fleet_of_one_server_reads_engine_and_cache(rig: Rig) -> None:
    first, second = rig.served.demo.revisions[:2]
    for key in (first.key(), second.key(), first.key()):  # two misses, then an L0 hit
        rig.cache.acquire_future(key).result(timeout=10).release()
    rig.cache.check_integrity()
    body = rig.client.get("/admin/fleet", headers=rig.admin).json()
    assert body["policy"] is None and body["decisions"] == {}
    assert body["at_s"] > 1.6e9  # unix time
    (replica,) = body["replicas"]
    assert replica["replica_id"] == "local" and replica["healthy"] is True
    assert replica["report_age_s"] == 0.0
    assert replica["tiers"]["l0"] == {
        "count": 2, "used_bytes": 200, "capacity_bytes": 200, "tenant_default_max_bytes": None,
    }  # fmt: skip
    assert replica["tiers"]["l1"]["capacity_bytes"] == 1000
    assert replica["tiers"]["l2"]["capacity_bytes"] == 2000
    assert replica["hits"] == {"l0": 1, "l1": 0, "l2": 0, "miss": 2}
    assert replica["load"] == {
        "num_queued": 1, "num_running": 2, "num_active_tokens": 12, "kv_usage": 0.25,
        "evictions_per_min": 0.0,
    }  # fmt: skip


def test_evictions_per_min_counts_evictions_since_the_window_began(rig: Rig) -> None:
    model = rig.served.demo.revisions[0].ref
    rig.cache.acquire_future(rig.served.demo.revisions[0].key()).result(timeout=10).release()
    assert _load(rig)["evictions_per_min"] == 0.0  # the first view is the baseline
    evicted = rig.client.post(
        "/admin/residency/evict", json={"model": model, "tier": "L0"}, headers=rig.admin
    )
    assert evicted.json()["evicted"] is True
    assert _load(rig)["evictions_per_min"] == 1.0


def _load(rig: Rig) -> dict[str, Any]:
    body = rig.client.get("/admin/fleet", headers=rig.admin).json()
    return cast(dict[str, Any], body["replicas"][0]["load"])


def test_eviction_window_slides_over_one_minute() -> None:
    window = EvictionWindow()
    steps = [  # (time, cumulative evictions, evictions in the last minute)
        (0.0, 0, 0.0), (10.0, 5, 5.0), (30.0, 12, 12.0),
        (61.0, 15, 15.0),  # baseline: the sample at 0 s
        (70.0, 20, 15.0),  # baseline: the sample at 10 s
        (95.0, 20, 8.0),  # baseline: the sample at 30 s
        (200.0, 20, 0.0),
        (201.0, 3, 0.0),  # lower than before: the counters restarted
        (202.0, 4, 1.0),
    ]  # fmt: skip
    for now_s, total, expected in steps:
        assert window.per_min(now_s, total) == expected, now_s


def test_eviction_window_keeps_a_bounded_number_of_samples() -> None:
    window = EvictionWindow()
    for i in range(10_000):  # polled every 10 ms for 100 s
        window.per_min(i / 100, i // 100)  # one eviction a second
    assert window.num_samples <= 62
    assert window.per_min(100.0, 100) == 60.0  # the baseline: the sample at 40 s


def _summary(evictions: int) -> CacheSummary:
    tiers = (Tier.L0, Tier.L1, Tier.L2)
    stats = CacheStatsSnapshot(
        hits={Tier.L0: 7, Tier.L1: 2}, misses=3, loads={}, evictions={Tier.L1: evictions},
        reloads_after_eviction={}, load_failures=0, resident_count={}, resident_bytes={},
        stages={}, room_wait=None,
    )  # fmt: skip
    return CacheSummary(
        stats=stats, num_loading=0, num_blocked=0, used_bytes=dict.fromkeys(tiers, 10),
        capacity_bytes=dict.fromkeys(tiers, 100), num_copies=dict.fromkeys(tiers, 1),
    )  # fmt: skip


class _FakeCache:
    def __init__(self) -> None:
        self.result: CacheSummary | None = _summary(0)  # None: the engine is down

    def summary(self) -> CacheSummary:
        if self.result is None:
            raise EngineUnavailableError("the engine process has published no cache state")
        return self.result


class _DownEngine(FakeEngine):
    """An engine process that died: health says so, its load cannot be read."""

    def health(self) -> EngineHealth:
        return EngineHealth(up=False, num_restarts=1, down_reason="the engine process died")

    def load_snapshot(self) -> EngineLoad:
        raise EngineUnavailableError("the engine process died")


def test_local_state_with_an_injected_clock() -> None:
    clock, cache = ManualClock(), _FakeCache()
    source = LocalFleetState(FakeEngine(), cache, clock, wall_clock=lambda: 1234.5)  # type: ignore[arg-type]
    state = source.fleet_state()
    assert state.at_s == 1234.5
    (replica,) = state.replicas
    assert replica.hits == {"l0": 7, "l1": 2, "l2": 0, "miss": 3}
    assert replica.tiers["l2"] == TierOccupancy(count=1, used_bytes=10, capacity_bytes=100)
    clock.advance(30)
    cache.result = _summary(4)
    assert _evictions(source) == 4.0
    clock.advance(40)  # 70 s: the window starts at 10 s, after the first sample (0 s)
    cache.result = _summary(6)
    assert _evictions(source) == 6.0
    clock.advance(30)  # 100 s: the baseline is the sample at 30 s (4 evictions)
    assert _evictions(source) == 2.0


def _evictions(source: LocalFleetState) -> float:
    load = source.fleet_state().replicas[0].load
    assert load is not None
    return load.evictions_per_min


def test_engine_down_is_an_unhealthy_replica_not_an_error(served: Served) -> None:
    cache = _FakeCache()
    cache.result = None
    down = LocalFleetState(_DownEngine(), cache, ManualClock())  # type: ignore[arg-type]
    (replica,) = down.fleet_state().replicas
    assert replica.healthy is False and replica.load is None and dict(replica.tiers) == {}
    assert replica.hits == {"l0": 0, "l1": 0, "l2": 0, "miss": 0}
    no_cache = LocalFleetState(FakeEngine(), None, ManualClock()).fleet_state().replicas[0]
    assert no_cache.healthy is True and dict(no_cache.tiers) == {}
    engine = _DownEngine()
    built = make_app_deps(served, engine)
    assert built.cache is not None
    built.cache.close()  # the app below runs without a cache
    alone = LocalFleetState(engine, None, ManualClock())
    with TestClient(create_app(replace(built, cache=None, fleet=alone))) as client:
        answer = client.get("/admin/fleet", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["replicas"][0]["healthy"] is False


class _TwoReplicas:
    def fleet_state(self) -> FleetState:
        replicas = tuple(ReplicaState(name, True, 2.5, {}, {"miss": 1}, None) for name in "ab")
        return FleetState(at_s=99.0, policy="affinity", replicas=replicas, decisions={"l0": 4})


def test_a_given_fleet_source_is_what_fleet_shows(served: Served) -> None:
    deps = replace(make_app_deps(served, FakeEngine()), fleet=_TwoReplicas())
    with TestClient(create_app(deps)) as client:
        body = client.get("/admin/fleet", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert body == _TwoReplicas().fleet_state().to_json()
    assert [r["replica_id"] for r in body["replicas"]] == ["a", "b"]
    assert deps.cache is not None
    deps.cache.close()


def test_an_app_without_a_fleet_source_answers_503_naming_it(served: Served) -> None:
    """HTTP does not build a fleet view: without ``deps.fleet`` both fleet routes refuse."""
    deps = replace(make_app_deps(served, FakeEngine()), fleet=None)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with TestClient(create_app(deps)) as client:
        assert client.get("/admin/fleet").status_code == 401  # the admin key still comes first
        for path in ("/admin/fleet", "/admin/fleet/history"):
            answer = client.get(path, headers=admin)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "no_fleet"
        assert client.get("/admin/dashboard").status_code == 200  # the page itself holds no data
    assert deps.cache is not None
    deps.cache.close()


def test_static_files_are_public_with_strict_headers(rig: Rig) -> None:
    for path, content_type in STATIC.items():
        answer = rig.client.get(path)  # no credential: a browser navigating cannot send one
        assert answer.status_code == 200, path
        assert answer.headers["content-type"] == content_type, path
        assert answer.headers["content-security-policy"] == EXPECTED_CSP
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["cache-control"] == "no-store"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert {k.lower(): v for k, v in PAGE_HEADERS.items()}.items() <= answer.headers.items()
        assert "http://" not in answer.text and "https://" not in answer.text, path  # no CDN
        assert ADMIN_KEY not in answer.text


def test_the_page_has_no_inline_script_or_style_and_links_existing_files(rig: Rig) -> None:
    page = rig.client.get("/admin/dashboard").text
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.DOTALL)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    assert "<style" not in page and "style=" not in page
    # Relative to /admin/dashboard (the page) and /admin/dashboard/dashboard.js (the script).
    linked = [f"/admin/{name}" for name in re.findall(r'(?:src|href)="([^"]+)"', page)]
    script = rig.client.get("/admin/dashboard/dashboard.js").text
    imported = [f"/admin/dashboard/{name}" for name in re.findall(r'from "\./([^"]+)"', script)]
    assert sorted(linked + imported) == sorted(set(STATIC) - {"/admin/dashboard"})


def test_fleet_and_every_other_admin_path_need_the_admin_key(rig: Rig) -> None:
    tenant = rig.headers("acme")
    assert rig.client.get("/admin/fleet").status_code == 401
    assert rig.client.get("/admin/fleet", headers=tenant).status_code == 401
    assert rig.client.get("/admin/fleet", headers=rig.admin).status_code == 200
    paths = rig.client.get("/admin/openapi.json", headers=rig.admin).json()["paths"]
    admin_routes = [
        (path, method.upper())
        for path, operations in paths.items()
        if path.startswith("/admin")
        for method in operations
    ]
    assert len(admin_routes) > 10 and ("/admin/fleet", "GET") in admin_routes
    admin_routes.append(("/admin/openapi.json", "GET"))
    for path, method in admin_routes:
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        answer = rig.client.request(method, concrete)
        assert answer.status_code == 401, (method, path)


@pytest.mark.parametrize(
    "path",
    [
        "/admin/dashboard/../tenants", "/admin/dashboardx", "/admin/dashboard/",
        "/admin/dashboard/chart.js/", "/admin/dashboard/other.js", "/admin/dashboard/%2e%2e/fleet",
        "/admin/dashboard.html", "/admin/fleet", "/admin/dashboard/dashboard.html",
    ],
)  # fmt: skip
def test_only_the_exact_dashboard_paths_are_public(rig: Rig, path: str) -> None:
    assert required_credential(path) is Credential.ADMIN
    # Sent as is (an HTTP client would resolve the dot segments before sending).
    assert _raw_get_status(rig.client.app, path) == 401


def _raw_get_status(app: Any, path: str) -> int:
    scope = {
        "type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
        "query_string": b"", "headers": [], "http_version": "1.1", "scheme": "http",
        "server": ("testserver", 80), "client": ("127.0.0.1", 1), "root_path": "",
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return int(sent[0]["status"])


def test_admin_openapi_lists_fleet_but_not_the_static_files(rig: Rig) -> None:
    paths = rig.client.get("/admin/openapi.json", headers=rig.admin).json()["paths"]
    assert "/admin/fleet" in paths
    assert not DASHBOARD_PATHS & set(paths)
    assert "/admin/fleet" not in rig.client.get("/openapi.json").json()["paths"]


def test_with_an_admin_port_the_page_is_served_where_admin_is(served: Served) -> None:
    deps = make_app_deps(served, FakeEngine())
    sockets = bind_all("127.0.0.1", 0, None, 0)
    public, admin = (f"http://127.0.0.1:{s.getsockname()[1]}" for s in sockets)
    try:
        with listening(guarded(create_app(deps), sockets), sockets):
            for path in STATIC:
                assert httpx.get(f"{admin}{path}").status_code == 200, path
                assert httpx.get(f"{public}{path}").status_code == 404, path
    finally:
        assert deps.cache is not None
        deps.cache.close()


@contextmanager
def listening(app: Any, sockets: list[socket.socket]) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)
