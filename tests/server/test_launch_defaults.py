"""What ``loraplex serve`` gives on its defaults for the launch checklist, with no configuration:
a fair default share of every cache tier per tenant (``default_tenant_tier_share``, kept
against other tenants; free room beyond it is borrowed), shown in
``GET /admin/fleet``; and a warm policy for each demo tenant's core adapter (the bootstrap)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from live import Live, live_server

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.demo.assets import DemoAssets
from loraplex.registry import RegistryConfig, open_registry
from loraplex.residency.ledger import Tier
from loraplex.serve.bootstrap import register_demo
from loraplex.serve.config import ServeConfig, merge, read_config_file

CORE = {"acme/support@r1", "globex/search@r1", "initech/chat@r1"}
SWEEP = ("support", "billing", "legal", "triage")  # every adapter of acme


def _admin(live: Live) -> httpx.Client:
    headers = {"Authorization": f"Bearer {live.server.admin_key}"}
    return httpx.Client(base_url=live.url, headers=headers, timeout=60)


def _complete(live: Live, tenant: str, model: str) -> None:
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {live.key(tenant)}"}
    reply = httpx.post(f"{live.url}/v1/completions", json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text


def _gpu_copies(admin: httpx.Client) -> list[dict[str, Any]]:
    entries = admin.get("/admin/residency").json()["entries"]
    return [e for e in entries if e["tier"] == "L0"]


def test_the_share_is_a_fraction_named_when_refused(tmp_path: Path) -> None:
    assert ServeConfig(data_dir=tmp_path).default_tenant_tier_share == 0.5
    for bad in (0.0, -0.25, 1.5):
        with pytest.raises(ValueError, match=f"default_tenant_tier_share {bad} is invalid"):
            ServeConfig(data_dir=tmp_path, default_tenant_tier_share=bad)
    path = tmp_path / "serve.toml"
    path.write_text("[serve]\ndefault_tenant_tier_share = 1\n", encoding="utf-8")
    config = merge(read_config_file(path), {"data_dir": tmp_path})
    assert config.default_tenant_tier_share == 1


def test_one_tenants_sweep_borrows_free_slots_and_never_takes_anothers(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """The share is work-conserving: acme's sweep of 4 adapters over 4 slots borrows the 3
    slots globex leaves free (beyond its share of 2) and then evicts its own copies only."""
    settings = {"max_loras": 4, "auto_warm": False, "engine_process": False, "torch_threads": 1}
    with live_server(demo_assets, tmp_path, **settings) as live, _admin(live) as admin:
        ledgers = live.server.runtime.cache.ledgers  # type: ignore[union-attr]
        assert all(ledgers[t].budget.default_tenant_share == 0.5 for t in ledgers)
        (replica,) = admin.get("/admin/fleet").json()["replicas"]
        for tier in replica["tiers"].values():
            assert tier["tenant_default_max_bytes"] == tier["capacity_bytes"] // 2
        half = replica["tiers"]["l0"]["tenant_default_max_bytes"]
        _complete(live, "globex", "search")
        most = 0
        for name in SWEEP:
            _complete(live, "acme", name)
            held = [e for e in _gpu_copies(admin) if e["model"].startswith("acme/")]
            most = max(most, len(held))
            assert "globex/search@r1" in {e["model"] for e in _gpu_copies(admin)}
        assert most == 3  # of 4 slots: every free one, none of globex's
        live.server.runtime.cache.check_integrity()  # type: ignore[union-attr]
        assert ledgers[Tier.L0].tenant_bytes["acme"] > half


def test_a_share_of_1_shows_no_default_bound(demo_assets: DemoAssets, tmp_path: Path) -> None:
    settings = {"default_tenant_tier_share": 1.0, "torch_threads": 1, "auto_warm": False}
    with live_server(demo_assets, tmp_path, **settings) as live, _admin(live) as admin:
        (replica,) = admin.get("/admin/fleet").json()["replicas"]
        assert {t["tenant_default_max_bytes"] for t in replica["tiers"].values()} == {None}


def test_tier_share_by_priority_reaches_the_cache(demo_assets: DemoAssets, tmp_path: Path) -> None:
    """The config key is read from the file and reaches the running cache (off by default)."""
    path = tmp_path.parent / f"{tmp_path.name}.toml"
    path.write_text("[serve]\ntier_share_by_priority = true\n", encoding="utf-8")
    assert merge(read_config_file(path), {"data_dir": tmp_path}).tier_share_by_priority
    assert not ServeConfig(data_dir=tmp_path).tier_share_by_priority
    settings = {"tier_share_by_priority": True, "engine_process": False, "torch_threads": 1}
    with live_server(demo_assets, tmp_path, **settings) as live:
        assert live.server.runtime.cache.config.tier_share_by_priority  # type: ignore[union-attr]


def test_the_core_adapters_are_kept_warm_in_host_memory(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    with live_server(demo_assets, tmp_path, torch_threads=1) as live, _admin(live) as admin:
        listed = [admin.get(f"/admin/adapters/{a['tenant']}/{a['name']}").json()
                  for a in admin.get("/admin/adapters").json()]  # fmt: skip
        warm = {
            f"{a['adapter']['tenant']}/{a['adapter']['name']}@{r['revision']}": r["warm_policy"]
            for a in listed
            for r in a["revisions"]
        }
        assert {ref for ref, policy in warm.items() if policy != "on_demand"} == CORE
        assert {warm[ref] for ref in CORE} == {"cpu"}
        served = {f"{a['adapter']['tenant']}/{a['adapter']['name']}@{t['revision']}"
                  for a in listed for t in a["alias"]["targets"]}  # fmt: skip
        assert served >= CORE  # the revisions the aliases serve
        deadline = time.monotonic() + 60
        while True:  # the engine applies the policies at start: pinned in L1 (host memory)
            entries = admin.get("/admin/residency").json()["entries"]
            pinned = {e["model"] for e in entries if e["tier"] == "L1" and e["pinned"]}
            if pinned >= CORE or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert pinned >= CORE


def test_an_operators_later_choice_survives_a_restart(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    registry = open_registry(RegistryConfig(tmp_path), base=base)
    try:
        first = register_demo(registry, demo_assets)
        assert set(first.core) == CORE
        registry.set_release("acme/support@r1", "operator", warm_policy=WarmPolicy.ON_DEMAND)
        again = register_demo(registry, demo_assets)  # what the next start does
        assert set(again.core) == CORE
        policies = {r.ref: r.warm_policy for r in again.revisions}
        assert policies["acme/support@r1"] is WarmPolicy.ON_DEMAND
        assert policies["globex/search@r1"] is WarmPolicy.CPU
    finally:
        registry.close()
