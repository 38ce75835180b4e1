"""End to end: a real Prometheus scraping a real ``loraplex serve`` (engine process, two GPU
slots) with the shipped rules, windows rendered to 10 s and ``for:`` to 1 s
(``prometheus_kit.render_rules``). Cycling more adapters than slots makes reload-after-eviction
and thrash fire, then resolve once the cycling stops; killing the engine process makes
engine-down fire, then resolve once it is back. Then every PromQL expression of the Grafana
dashboard is evaluated against that Prometheus and must return data (the fleet row's against a
fleet ingress's collector, see ``test_fleet_panels_return_data``), and an operator's rollback of
the release used for the release panels makes the rollback alert fire."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_exposition import Board, engine_request, exposed, route
from prometheus_kit import (
    DASHBOARD,
    PROMETHEUS,
    RULES,
    Prometheus,
    Served,
    Target,
    render_rules,
    running_prometheus,
    serving,
    wait_until,
)

from loraplex.demo.assets import DemoAssets
from loraplex.engine.transport.process import EngineProcess
from loraplex.engine.transport.thread_client import AsyncEngine
from loraplex.fleet.replica import EngineReplica, ReplicaParts

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus not installed (Debian package `prometheus`; .ci/run installs it)",
)

ADMIN = "test-admin-credential-0123456789"
WINDOW = "10s"  # every range window of the rules, rendered
FLEET_ROW = "Fleet (ingress)"


def dashboard_exprs(row: str | None = None, *, exclude: str | None = None) -> list[str]:
    """The PromQL of the dashboard's panel targets (of ``row`` only, or all but ``exclude``)."""
    current, exprs = "", []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            continue
        if (row is None or current == row) and current != exclude:
            exprs.extend(target["expr"] for target in panel["targets"])
    return exprs


def _complete(served: Served, tenant: str, model: str) -> httpx.Response:
    key = served.server.sample_keys[tenant]
    body = {"model": model, "prompt": "hello", "max_tokens": 2, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{served.url}/v1/completions", json=body, headers=headers, timeout=60)


def _cycle(served: Served, assets: DemoAssets) -> None:
    """One request per demo revision (more revisions than GPU slots: each one evicts another)."""
    for adapter in assets.adapters:
        answered = _complete(served, adapter.tenant, f"{adapter.name}@{adapter.revision}")
        assert answered.status_code == 200, answered.text


def _firing(prom: Prometheus, name: str, **labels: str) -> bool:
    return prom.state(name, **labels) == "firing"


def _thrash_fires_then_resolves(prom: Prometheus, served: Served, assets: DemoAssets) -> None:
    started = time.monotonic()
    while not (
        _firing(prom, "LoraplexReloadAfterEviction", tier="L0")
        and _firing(prom, "LoraplexAdapterThrash", tier="L0")
    ):
        assert time.monotonic() - started < 60, prom.alerts()
        _cycle(served, assets)
    assert prom.query('sum(increase(adapter_thrash_events_total{tier="L0"}[1m])) > 3')
    wait_until(
        lambda: prom.state("LoraplexReloadAfterEviction", tier="L0") == "inactive"
        and prom.state("LoraplexAdapterThrash", tier="L0") == "inactive",
        60, "reload-after-eviction and thrash resolved",
    )  # fmt: skip


def _engine_down_fires_then_resolves(prom: Prometheus, served: Served, assets: DemoAssets) -> None:
    engine = served.server.engine
    assert isinstance(engine, EngineProcess)
    adapter = assets.adapters[0]
    refused = 0
    started = time.monotonic()
    while not _firing(prom, "LoraplexEngineDown"):
        assert time.monotonic() - started < 60, prom.alerts()
        pid = engine.pid
        if pid is not None and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)  # again if it came back before the alert fired
        answered = _complete(served, adapter.tenant, adapter.name)
        refused += answered.status_code == 503
        time.sleep(0.2)
    assert refused > 0  # the tenant saw 503s while it was down
    wait_until(lambda: httpx.get(f"{served.url}/ready").status_code == 200, 90, "engine back")
    wait_until(lambda: prom.state("LoraplexEngineDown") == "inactive", 30, "engine-down resolved")
    assert prom.query('sum(loraplex_tenant_responses_total{code="503"}) > 0')


def _warm_and_base_requests(served: Served, assets: DemoAssets) -> None:
    """Warm TTFT samples: the same adapter twice in a row, and the base model."""
    adapter = assets.adapters[0]
    for model in (adapter.name, adapter.name, assets.base_model_name):
        assert _complete(served, adapter.tenant, model).status_code == 200


def _start_release(served: Served) -> dict[str, Any]:
    body = {"tenant": "acme", "name": "support", "revision": "r2", "ladder": [0.5],
            "dwell_s": 3600, "auto_promote": False}  # fmt: skip
    auth = {"Authorization": f"Bearer {ADMIN}"}
    started = httpx.post(f"{served.url}/admin/releases", json=body, headers=auth, timeout=30)
    assert started.status_code == 201, started.text
    status: dict[str, Any] = {}

    def in_canary() -> bool:
        nonlocal status
        status = httpx.get(f"{served.url}/admin/releases/acme/support", headers=auth).json()
        assert status["state"] not in ("rolled_back", "aborted"), status
        return bool(status["state"] == "canary")

    wait_until(in_canary, 60, "release in canary")
    return status


def _roll_back_release(served: Served) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    rolled = httpx.post(f"{served.url}/admin/releases/acme/support/rollback", headers=auth)
    assert rolled.status_code == 200 and rolled.json()["state"] == "rolled_back", rolled.text


def test_alerts_fire_and_resolve_and_every_dashboard_panel_has_data(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    rules = render_rules(RULES.read_text(), window=WINDOW, hold="1s")
    config = {"admin_key": ADMIN, "max_loras": 2, "auto_warm": False}
    with serving(demo_assets, tmp_path / "server", **config) as served:
        served.server.wait_engine(120)
        target = Target("loraplex", served.address, bearer=ADMIN)
        with running_prometheus(tmp_path / "prometheus", [target], rules) as prom:
            wait_until(lambda: bool(prom.query("loraplex_engine_up == 1")), 30, "first scrape")
            _thrash_fires_then_resolves(prom, served, demo_assets)
            _engine_down_fires_then_resolves(prom, served, demo_assets)
            _warm_and_base_requests(served, demo_assets)
            _start_release(served)  # in canary: the release family has series
            time.sleep(3)  # a few scrapes of them
            try:
                empty = [e for e in dashboard_exprs(exclude=FLEET_ROW) if not prom.query(e)]
            finally:
                _roll_back_release(served)  # by the operator: counted as a rollback too
            assert empty == []
            wait_until(lambda: _firing(prom, "LoraplexReleaseRolledBack"), 30, "rollback alert")


def test_fleet_panels_return_data_and_replica_loss_alerts_fire(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """The fleet row against a fleet ingress's family (``fleet_exposition``: the real collector
    and link over live replica statuses, no Ray): every expression returns data; a replica whose
    reports stop is out of rotation (unhealthy fires), and one that leaves the board fires
    replica loss."""
    rules = render_rules(RULES.read_text(), window=WINDOW, hold="1s")
    config = {"admin_key": ADMIN, "max_loras": 2, "auto_warm": False, "engine_process": False}
    with serving(demo_assets, tmp_path / "server", **config) as served:
        server = served.server
        assert isinstance(server.engine, AsyncEngine) and server.runtime is not None
        parts = ReplicaParts(server.engine, server.runtime, server.registry, tmp_path / "replica")
        board = Board({rid: EngineReplica(rid, parts) for rid in ("replica-a", "replica-b")})
        _cycle(served, demo_assets)  # residency and hits for the replicas' statuses
        route(board, [engine_request(f"route-{i}", "acme") for i in range(4)])
        with (
            exposed(board) as address,
            running_prometheus(
                tmp_path / "prometheus", [Target("loraplex-ingress", address)], rules
            ) as prom,
        ):
            exprs = dashboard_exprs(FLEET_ROW)
            assert exprs and all("loraplex_fleet_" in e for e in exprs)
            wait_until(lambda: all(prom.query(e) for e in exprs), 30, "every fleet panel")
            board.stale.add("replica-b")  # its reports stopped
            wait_until(
                lambda: _firing(prom, "LoraplexFleetReplicaUnhealthy", replica="replica-b"),
                30, "replica-b unhealthy",
            )  # fmt: skip
            assert prom.state("LoraplexFleetReplicaUnhealthy", replica="replica-a") == "inactive"
            del board.replicas["replica-b"]  # and it left the board
            wait_until(lambda: _firing(prom, "LoraplexFleetReplicaLost"), 30, "replica lost")
            wait_until(
                lambda: prom.state("LoraplexFleetReplicaUnhealthy") == "inactive",
                30, "unhealthy resolved once it left",
            )  # fmt: skip
