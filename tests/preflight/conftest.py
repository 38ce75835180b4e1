"""Preflight fixtures: real servers (``tests/server/live.py``) on ``loraplex serve``'s embedded
defaults, or misconfigured the way an operator could."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from live import Live, live_server

from loraplex.demo.assets import DemoAssets

# The alert rules loraplex ships (what a deployment loads; the preflight reads which series
# they use).
SHIPPED_RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus/loraplex-rules.yml"
RULES_TEXT = SHIPPED_RULES.read_text(encoding="utf-8")


def admin_client(live: Live) -> httpx.Client:
    headers = {"Authorization": f"Bearer {live.server.admin_key}"}
    return httpx.Client(base_url=live.url, headers=headers, timeout=60)


def drop_warm_policies(live: Live) -> None:
    """What an operator who sets every revision back to ``on_demand`` leaves: no warm policy."""
    with admin_client(live) as admin:
        for listed in admin.get("/admin/adapters").json():
            path = f"/admin/adapters/{listed['tenant']}/{listed['name']}"
            for revision in admin.get(path).json()["revisions"]:
                if revision["warm_policy"] == "on_demand":
                    continue
                ref = f"{listed['tenant']}/{listed['name']}/{revision['revision']}"
                reply = admin.put(f"/admin/revisions/{ref}", json={"warm_policy": "on_demand"})
                assert reply.status_code == 200, reply.text


@pytest.fixture(scope="module")
def default_server(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    """``loraplex serve`` on its embedded defaults: nothing configured, nothing set through the
    admin API (one torch thread: the test machine is shared)."""
    with live_server(demo_assets, tmp_path_factory.mktemp("default"), torch_threads=1) as live:
        yield live


@dataclass(frozen=True)
class Bare:
    """A misconfigured server and its data directory (its registry database is there)."""

    live: Live
    data_dir: Path


@pytest.fixture(scope="module")
def bare_server(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bare]:
    """No warm policy (the operator dropped the demo's), no tenant budget (the default share
    turned off, no tenant cap), automatic warming off."""
    data_dir = tmp_path_factory.mktemp("bare")
    settings = {"torch_threads": 1, "auto_warm": False, "default_tenant_tier_share": 1.0}
    with live_server(demo_assets, data_dir, **settings) as live:
        drop_warm_policies(live)
        yield Bare(live, data_dir)
