"""Preflight fixtures: real servers (``tests/server/live.py``) made launch-ready the way an
operator does it through the admin API, or left misconfigured."""

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

CORE_ADAPTER = ("acme", "support", "r1")  # the demo's core adapter: given a gpu warm policy
# Per-tenant residency budgets of a launch-ready demo: room for a few adapters per tier.
TENANT_QUOTAS = {"max_gpu_bytes": 32 << 20, "max_cpu_bytes": 256 << 20}
# Alert rules as a deployment would load them (the preflight reads which series they use).
RULES_TEXT = """groups:
- name: adapters
  rules:
  - alert: AdapterReloadAfterEviction
    expr: rate(adapter_reload_after_eviction_total[5m]) > 0.1
  - alert: AdapterEvictions
    expr: rate(adapter_evictions_total[5m]) > 1
"""


def admin_client(live: Live) -> httpx.Client:
    headers = {"Authorization": f"Bearer {live.server.admin_key}"}
    return httpx.Client(base_url=live.url, headers=headers, timeout=60)


def make_launch_ready(live: Live) -> None:
    """What the checklist asks of an operator: a warm policy for the core adapter, a residency
    budget for every tenant."""
    tenant, name, revision = CORE_ADAPTER
    with admin_client(live) as admin:
        reply = admin.put(
            f"/admin/revisions/{tenant}/{name}/{revision}", json={"warm_policy": "gpu"}
        )
        assert reply.status_code == 200, reply.text
        for row in admin.get("/admin/tenants").json():
            reply = admin.put(f"/admin/tenants/{row['name']}", json={"quotas": TENANT_QUOTAS})
            assert reply.status_code == 200, reply.text


@pytest.fixture(scope="module")
def ready_server(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    """``loraplex serve``'s defaults, made launch-ready through the admin API."""
    with live_server(demo_assets, tmp_path_factory.mktemp("ready"), torch_threads=1) as live:
        make_launch_ready(live)
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
    """The demo as registered: no warm policy, no tenant budget, automatic warming off."""
    data_dir = tmp_path_factory.mktemp("bare")
    with live_server(demo_assets, data_dir, torch_threads=1, auto_warm=False) as live:
        yield Bare(live, data_dir)
