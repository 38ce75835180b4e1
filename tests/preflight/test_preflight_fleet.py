"""``loraplex preflight`` against a fleet: two engine replicas behind the ingress on a local Ray
cluster (started as ``tests/fleet/test_fleet_e2e.py`` does), deployed as ``fleet up`` deploys
(``control.deploy``: the ingress on loraplex's own listener, no Ray Serve proxy), on ``fleet
up``'s defaults: no tenant configured, nothing set through the admin API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RULES_TEXT
from ray_cluster import deploy_fleet

ray = pytest.importorskip("ray")

from loraplex.demo.assets import DemoAssets  # noqa: E402
from loraplex.fleet.ray_cluster import free_port  # noqa: E402
from loraplex.preflight import LoadConfig, PreflightConfig, Status, preflight  # noqa: E402
from loraplex.serve.assembly import DEMO_DIR  # noqa: E402
from loraplex.serve.config import ServeConfig  # noqa: E402

pytestmark = pytest.mark.slow
REPLICAS = 2
WAIT_S = 180.0


def _healthy(url: str, admin_key: str) -> int:
    headers = {"Authorization": f"Bearer {admin_key}"}
    reply = httpx.get(f"{url}/admin/fleet", headers=headers, timeout=30)
    return sum(1 for r in reply.json()["replicas"] if r["healthy"]) if reply.is_success else 0


@pytest.fixture(scope="module")
def fleet(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory, ray_cluster: None
) -> Iterator[tuple[str, str]]:
    """The fleet on the local Ray cluster the fleet tests share (a fresh Ray Serve)."""
    data_dir: Path = tmp_path_factory.mktemp("fleet")
    (data_dir / DEMO_DIR).symlink_to(demo_assets.root, target_is_directory=True)
    from ray import serve

    try:
        # 4 GPU slots per replica: the demo's 12 adapters exceed the fleet's 8 (item 3 meets
        # evictions); every other setting is serve's default.
        config = ServeConfig(data_dir=data_dir, port=free_port(), torch_threads=1, max_loras=4)
        url, prepared = deploy_fleet(config, REPLICAS, WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while _healthy(url, prepared.admin_key) < REPLICAS:
            assert time.monotonic() < deadline, f"fewer than {REPLICAS} healthy replicas"
            time.sleep(0.5)
        yield url, prepared.admin_key
    finally:
        serve.shutdown()


def test_the_default_fleet_passes(fleet: tuple[str, str]) -> None:
    url, admin_key = fleet
    config = PreflightConfig(url=url, admin_key=admin_key, rules_text=RULES_TEXT,
                             load=LoadConfig(load_s=4.0))  # fmt: skip
    report = preflight(config)
    assert report.exit_code() == 0, report.text()
    statuses = {v.item_id: v.status for v in report.verdicts}
    assert statuses["router_affinity_and_load"] is Status.PASS, report.text()
    assert report.facts["replicas"] == REPLICAS
    assert report.facts["policy"] == "affinity_until_saturated"
    not_passed = {i: s for i, s in statuses.items() if s is not Status.PASS}
    assert not not_passed, report.text()
    # item 7 on the replicas' default share: every replica reports one for both tiers
    bounded = report.verdict("tenant_pollution_bounded").evidence
    assert "with a byte cap of their own: none" in bounded[0]
    assert "GPU tier None" not in bounded[1] and "CPU tier None" not in bounded[1]
