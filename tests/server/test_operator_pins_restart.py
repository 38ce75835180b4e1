"""An operator's pins and warm policies outlive a restart of the whole server (schema 8), not
only of its engine process: ``loraplex serve`` started again on the same data directory holds
them before it takes requests, an unpin stays unpinned, and a recorded pin whose revision is
gone is dropped from the registry (logged) without failing the start."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from live import running

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.demo.assets import DemoAssets
from loraplex.residency.ledger import Tier
from loraplex.serve.assembly import DEMO_DIR, build_server
from loraplex.serve.config import ServeConfig
from loraplex.serve.front import Server
from loraplex.server.pin_owners import OPERATOR, OwnedPins

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


@contextmanager
def _serving(assets: DemoAssets, data_dir: Path) -> Iterator[tuple[Server, httpx.Client]]:
    """``loraplex serve`` on ``data_dir`` (the demo set adopted), as often as called."""
    if not (data_dir / DEMO_DIR).exists():
        (data_dir / DEMO_DIR).symlink_to(assets.root, target_is_directory=True)
    server = build_server(ServeConfig(data_dir=data_dir, admin_key=ADMIN))
    try:
        with running(server.app) as url, httpx.Client(base_url=url, timeout=60) as http:
            yield server, http
    finally:
        server.close()


def _pinned(http: httpx.Client) -> set[tuple[str, str]]:
    entries = http.get("/admin/residency", headers=AUTH).json()["entries"]
    return {(e["model"], e["tier"]) for e in entries if e["pinned"]}


def _until_pinned(http: httpx.Client, wanted: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The pinned copies once ``wanted`` are among them (their loads run in the background)."""
    deadline = time.monotonic() + 120
    while not wanted <= (pinned := _pinned(http)):
        assert time.monotonic() < deadline, f"{wanted - pinned} not pinned; pinned: {pinned}"
        time.sleep(0.1)
    return pinned


def _post(http: httpx.Client, path: str, model: str, tier: str) -> None:
    reply = http.post(path, json={"model": model, "tier": tier, "wait": True}, headers=AUTH)
    assert reply.status_code == 200, reply.text


def test_pins_and_warm_policies_outlive_a_server_restart(
    demo_assets: DemoAssets, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pinned, lifted, warm, cold = (
        f"{a.tenant}/{a.name}@{a.revision}" for a in demo_assets.adapters[:4]
    )
    with _serving(demo_assets, tmp_path) as (server, http):
        _post(http, "/admin/residency/pin", pinned, "L0")  # (L1: some demo revisions' warm policy)
        _post(http, "/admin/residency/pin", lifted, "L0")
        _post(http, "/admin/residency/unpin", lifted, "L0")
        for ref, policy in ((warm, "cpu"), (cold, "on_demand")):
            path = "/admin/revisions/" + ref.replace("@", "/")
            assert http.put(path, json={"warm_policy": policy}, headers=AUTH).is_success
        _until_pinned(http, {(pinned, "L0"), (warm, "L1")})
        tenant = demo_assets.adapters[0].tenant
        with server.registry.db.transaction() as tx:  # a pin whose revision is gone
            tx.execute(
                "INSERT INTO operator_pins VALUES (?, 'ghost', 'r1', 'L1', ?, 1.0, 'ops')",
                (tenant, "d" * 64),
            )

    with _serving(demo_assets, tmp_path) as (server, http):
        now = _until_pinned(http, {(pinned, "L0"), (warm, "L1")})
        assert (lifted, "L0") not in now, now  # its unpin held
        registry = server.registry
        digest = registry.base_digest
        assert digest is not None
        assert [(p.revision.ref, p.tier) for p in registry.operator_pins(digest)] == [
            (pinned, "L0")
        ]
        dropped = [e for e in registry.audit_log() if e.action == "residency.pin_dropped"]
        assert [e.subject for e in dropped] == [f"{tenant}/ghost@r1"]
        assert any("dropped from the registry" in m for m in caplog.messages)
        policies = {k.ref: w for k, w in registry.warm_policies(digest).items()}
        assert (policies[warm], policies[cold]) == (WarmPolicy.CPU, WarmPolicy.ON_DEMAND)
        cache = server.deps.cache
        assert isinstance(cache, OwnedPins)
        key = registry.get_revision(pinned).key()
        assert cache.owners(key, Tier.L0) == {OPERATOR}  # a release's end never lifts it
        _post(http, "/admin/residency/unpin", pinned, "L0")
        assert registry.operator_pins(digest) == []
        assert (pinned, "L0") not in _pinned(http)
