"""Pins and operator warm policies outlive the engine process: a restarted child gets them
again before any request reaches it (a release's held stable revision must stay resident)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
from live import live_server

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.demo.assets import DemoAssets
from loraplex.engine.standing import StandingSettings
from loraplex.engine.transport.messages import Evict, Pin, Prefetch, SetWarm, Unpin
from loraplex.engine.transport.process import EngineProcess
from loraplex.residency.ledger import Tier

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _key(name: str) -> AdapterKey:
    return AdapterKey("b" * 64, "acme", name, "r1", "0" * 64)


def test_standing_settings_follow_pins_unpins_and_warm_policies() -> None:
    standing = StandingSettings()
    a, b = _key("a"), _key("b")
    for command in (
        Pin(a, Tier.L1),
        Pin(a, Tier.L0),
        Pin(b, Tier.L1),
        Unpin(a, Tier.L0),
        Prefetch(b, Tier.L0),  # holds nothing across a restart
        Evict(b, Tier.L2),
        SetWarm(a, WarmPolicy.CPU),
        SetWarm(b, WarmPolicy.ON_DEMAND),
        SetWarm(b, None),  # back to automatic: nothing to replay
    ):
        standing.record(command)
    assert standing.pins() == {a: frozenset({Tier.L1}), b: frozenset({Tier.L1})}
    assert standing.replay() == [
        SetWarm(a, WarmPolicy.CPU),
        Pin(a, Tier.L1),
        Pin(b, Tier.L1),
    ]
    standing.record(Unpin(b, Tier.L1))
    standing.record(Unpin(b, Tier.L1))  # twice: still nothing, no error
    assert standing.pins() == {a: frozenset({Tier.L1})}


def _wait(predicate: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_pin_holds_again_after_the_engine_process_restarts(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    adapter = demo_assets.adapters[1]
    ref = f"{adapter.tenant}/{adapter.name}@{adapter.revision}"
    with live_server(demo_assets, tmp_path, admin_key=ADMIN) as live:
        engine = live.server.engine
        assert isinstance(engine, EngineProcess)
        http = httpx.Client(base_url=live.url, timeout=30)
        pin = {"model": ref, "tier": "L1", "wait": True}
        assert http.post("/admin/residency/pin", json=pin, headers=AUTH).json()["status"] == (
            "resident"
        )

        def pinned_in_l1() -> bool:
            entries = http.get("/admin/residency", headers=AUTH).json()["entries"]
            return any(e["model"] == ref and e["tier"] == "L1" and e["pinned"] for e in entries)

        assert pinned_in_l1()
        dead = engine.pid
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        _wait(lambda: engine.pid != dead and http.get("/ready").status_code == 200, "no restart")
        _wait(pinned_in_l1, f"{ref} is not pinned in L1 in the restarted engine")

        unpin = {"model": ref, "tier": "L1"}
        assert http.post("/admin/residency/unpin", json=unpin, headers=AUTH).is_success
        assert not pinned_in_l1()
