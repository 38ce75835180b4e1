"""``build_server`` hands the registry's tenant classes and quotas to the cache and the engine,
at start and live when the admin API creates or changes a tenant; the engine-side serve settings
(step token budget, load concurrency, automatic warm policies, which a deprecation drops) reach
the cache of a server whose engine runs on a thread, and the engine core that the engine process
builds."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.registry import RegistrationRequest
from loraplex.residency.ledger import Tier
from loraplex.residency.warm import AutoWarmConfig
from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_settings import settings_of
from loraplex.serve.engine_side import build_worker
from loraplex.serve.front import Server

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _config(assets: DemoAssets, data_dir: Path, **settings: object) -> ServeConfig:
    return ServeConfig(
        data_dir=data_dir,
        model=assets.base_model_dir,
        demo=False,
        admin_key=ADMIN,
        max_loras=4,
        max_num_seqs=4,
        engine_process=False,
        **settings,  # type: ignore[arg-type]
    )


def _server(assets: DemoAssets, data_dir: Path, **settings: object) -> Server:
    """The engine on a thread, so the test can read the runtime it shares with the app."""
    return build_server(_config(assets, data_dir, **settings))


def _caps(server: Server, tier: Tier) -> dict[str, int]:
    return dict(server.runtime.cache.ledgers[tier].budget.tenant_max_bytes)


def test_admin_changes_reach_the_running_cache(demo_assets: DemoAssets, tmp_path: Path) -> None:
    server = _server(demo_assets, tmp_path)
    try:
        with TestClient(server.app) as http:
            body = {
                "name": "storm",
                "priority": "batch",
                "quotas": {"max_gpu_bytes": 1 << 30, "max_cpu_bytes": 8192, "max_cold_loads": 1},
            }
            assert http.post("/admin/tenants", json=body, headers=AUTH).status_code == 201
            assert server.runtime.cache.config.tenant_priority == {"storm": 0.25}
            assert _caps(server, Tier.L0) == {"storm": 1 << 30}
            assert _caps(server, Tier.L1) == {"storm": 8192}
            assert server.runtime.tenants.max_cold_loads("storm") == 1

            # Quotas the body does not name keep their values; null lifts one.
            update = {"priority": "high", "quotas": {"max_cold_loads": 3, "max_gpu_bytes": None}}
            reply = http.put("/admin/tenants/storm", json=update, headers=AUTH)
            assert reply.status_code == 200, reply.text
            assert reply.json()["priority"] == "high"
            assert server.runtime.cache.config.tenant_priority == {"storm": 4.0}
            assert _caps(server, Tier.L0) == {}
            assert _caps(server, Tier.L1) == {"storm": 8192}
            assert server.runtime.tenants.get("storm") == settings_of(
                server.registry.get_tenant("storm")
            )
            key = server.registry.create_key("storm", "test").token
            denied = http.put(
                "/admin/tenants/storm", json=update, headers={"Authorization": f"Bearer {key}"}
            )
            assert denied.status_code == 401
            missing = http.put("/admin/tenants/nobody", json=update, headers=AUTH)
            assert missing.status_code == 404
            assert "does not exist" in missing.json()["error"]["message"]
    finally:
        server.close()
    restarted = _server(demo_assets, tmp_path)  # tenants of the registry apply from the start
    try:
        assert restarted.runtime.cache.config.tenant_priority == {"storm": 4.0}
        assert restarted.runtime.tenants.max_cold_loads("storm") == 3
    finally:
        restarted.close()


def test_a_gpu_cap_below_one_slot_is_refused_by_name(
    demo_assets: DemoAssets, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tenant's ``max_gpu_bytes`` below one GPU slot (``0`` too) was stored, and then every
    adapter request of the tenant was a permanent 422 ``adapter_too_large`` blaming its
    adapter. The admin API refuses it naming the field and the slot's size; one slot is taken.
    A cap stored behind its back (``loraplex tenants update``, which cannot know the slot) is
    refused at request time naming the tenant's cap, not the adapter."""
    config = _config(demo_assets, tmp_path)
    slot = config.slot_bytes(BaseModelSpec.from_dir(demo_assets.base_model_dir))
    server = build_server(config)
    try:
        with TestClient(server.app) as http:
            for cap in (0, 1, slot - 1):
                body = {"name": "tiny", "quotas": {"max_gpu_bytes": cap}}
                refused = http.post("/admin/tenants", json=body, headers=AUTH)
                assert refused.status_code == 400, refused.text
                error = refused.json()["error"]
                assert error["param"] == "quotas.max_gpu_bytes"
                assert f"max_gpu_bytes {cap} is invalid" in error["message"]
                assert f"one GPU slot of {slot} bytes" in error["message"]
            assert http.get("/admin/tenants", headers=AUTH).json() == []  # none was created
            body = {"name": "tiny", "quotas": {"max_gpu_bytes": slot}}
            assert http.post("/admin/tenants", json=body, headers=AUTH).status_code == 201
            for cap in (0, slot - 1):
                put = {"quotas": {"max_gpu_bytes": cap, "max_cold_loads": 2}}
                refused = http.put("/admin/tenants/tiny", json=put, headers=AUTH)
                assert refused.status_code == 400, refused.text
                assert refused.json()["error"]["param"] == "quotas.max_gpu_bytes"
            assert server.registry.get_tenant("tiny").quotas.max_cold_loads is None  # unchanged
            assert _caps(server, Tier.L0) == {"tiny": slot}

            adapter = demo_assets.adapters[0]
            request = RegistrationRequest(adapter.path, "tiny", adapter.name, adapter.revision)
            server.registry.register(request, "test")
            server.registry.set_tenant_limits("tiny", "cli", None, {"max_gpu_bytes": 1})
            applied = http.put("/admin/tenants/tiny", json={"quotas": {}}, headers=AUTH)
            assert applied.status_code == 200, applied.text  # applies the stored cap 1 too
            assert _caps(server, Tier.L0) == {"tiny": 1}
            token = server.registry.create_key("tiny", "test").token
            asked = http.post(
                "/v1/completions",
                json={"model": adapter.name, "prompt": "hello", "max_tokens": 2},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert asked.status_code == 422, asked.text
            error = asked.json()["error"]
            assert error["code"] == "tenant_cap_too_small", error
            named = "the tenant cap max_gpu_bytes 1 of tenant 'tiny'"
            assert named in error["message"], error
            assert "not the adapter" in error["message"]
    finally:
        server.close()
    with caplog.at_level(logging.WARNING, logger="loraplex.serve.engine_settings"):
        build_server(config).close()  # a start names the tenants such a cap leaves adapterless
    warned = [r.getMessage() for r in caplog.records if "below one GPU slot" in r.getMessage()]
    assert len(warned) == 1 and f"of {slot} bytes" in warned[0] and "tiny (1)" in warned[0]


def test_cache_settings_reach_the_running_cache(demo_assets: DemoAssets, tmp_path: Path) -> None:
    server = _server(
        demo_assets,
        tmp_path,
        max_concurrent_loads=3,
        tenant_max_concurrent_loads=1,
        auto_warm_interval_s=2.5,
    )
    try:
        assert server.runtime is not None
        cache = server.runtime.cache.config
        assert (cache.max_concurrent_loads, cache.tenant_max_concurrent_loads) == (3, 1)
        assert cache.auto_warm == AutoWarmConfig()  # on by default
        assert server.runtime.rebalance_interval_s == 2.5
    finally:
        server.close()


def test_engine_process_builder_gets_the_same_settings(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """``build_worker`` (what the engine process runs) builds from the same settings."""
    config = _config(demo_assets, tmp_path, max_num_batched_tokens=40, auto_warm=False)
    handles = build_worker(config, demo_assets.base_model_dir)
    try:
        assert handles.core.scheduler.config.max_num_batched_tokens == 40
        assert handles.core.cache is not None and handles.core.cache.config.auto_warm is None
    finally:
        handles.close()


def test_admin_seat_limits_reach_the_engine_and_survive_restart(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    seats = {"max_running_seqs": 3, "reserved_running_seqs": 1, "max_kv_blocks": 40}
    server = _server(demo_assets, tmp_path)
    try:
        with TestClient(server.app) as http:
            body = {"name": "fan", "quotas": {"max_running_seqs": 2}}
            assert http.post("/admin/tenants", json=body, headers=AUTH).status_code == 201
            assert server.runtime.tenants.get("fan").max_running_seqs == 2
            reply = http.put("/admin/tenants/fan", json={"quotas": seats}, headers=AUTH)
            assert reply.status_code == 200, reply.text
            assert reply.json()["quotas"] | seats == reply.json()["quotas"]
            fan = server.runtime.tenants.get("fan")  # the book the engine's scheduler reads
            assert (fan.max_running_seqs, fan.reserved_running_seqs, fan.max_kv_blocks) == (
                3,
                1,
                40,
            )
            for bad, field in [
                (
                    {"reserved_running_seqs": 4},
                    "reserved_running_seqs 4 is invalid; expected <= max_running_seqs 3",
                ),
                ({"max_running_seqs": -2}, "max_running_seqs -2 is invalid"),
                ({"max_kv_blocks": 0}, "max_kv_blocks 0 is invalid"),
                ({"reserved_running_seqs": None}, "reserved_running_seqs"),
            ]:
                refused = http.put("/admin/tenants/fan", json={"quotas": bad}, headers=AUTH)
                assert refused.status_code in {400, 422}, refused.text
                assert field in refused.json()["error"]["message"]
            assert server.runtime.tenants.get("fan") == fan  # nothing changed
            missing = http.put("/admin/tenants/ghost", json={"quotas": seats}, headers=AUTH)
            assert missing.status_code == 404
    finally:
        server.close()
    restarted = _server(demo_assets, tmp_path)
    try:
        assert restarted.runtime.tenants.get("fan") == fan
    finally:
        restarted.close()


def test_automatic_gpu_promotion_happens_in_a_served_config(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Issue 26: ``loraplex serve`` built its cache with no automatic GPU slots, so a hot
    revision could only ever be promoted to cpu. By default a quarter of the GPU slots (1 of
    4 here) may be pinned automatically; the next hot revision gets cpu, not a second slot."""
    server = _server(demo_assets, tmp_path)
    try:
        assert server.runtime is not None
        cache = server.runtime.cache
        assert cache.config.max_auto_gpu_slots == 1
        base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
        server.registry.create_tenant("hot", "test")
        keys = []
        for adapter in demo_assets.adapters[:2]:
            request = RegistrationRequest(adapter.path, "hot", adapter.name, adapter.revision)
            keys.append(server.registry.register(request, "test").revision.key())
            assert keys[-1].base_digest == base.digest
        # 400 and 300 requests at once: 5-minute rates of 4/3 and 1/s, over gpu_rps 0.5; the
        # hotter one gets the slot (the slots are ranked by rate, not given in key order)
        for key, count in zip(keys, (400, 300), strict=True):
            for _ in range(count):
                cache.acquire_future(key).result(timeout=60).release()
        assert cache.rebalance() == {keys[0]: WarmPolicy.GPU, keys[1]: WarmPolicy.CPU}
        l0 = cache.ledgers[Tier.L0].entries  # both copies are in L0: only the first is pinned
        assert l0[keys[0]].pinned and not l0[keys[1]].pinned
        cache.check_integrity()
    finally:
        server.close()


def test_deprecation_drops_the_automatic_warm_seat_not_the_operators(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """A deprecated revision gives up the automatic warm seat the alias's traffic earned it
    (docs/registry.md, *Warm policies of a deprecated revision*): the PUT unpins its copy at
    once and the next rebalance does not hand the seat back from the old rates; an operator's
    warm policy stays. NOTE: found by the newop2 pass (docs/benchmarks/newop2.md): a retired
    revision's copy stayed pinned ``warm_policy:cpu (automatic)`` in its tenant's share until
    the owner set ``on_demand``."""
    server = _server(demo_assets, tmp_path)
    try:
        assert server.runtime is not None
        cache, registry = server.runtime.cache, server.registry
        registry.create_tenant("newco", "test")
        hot, kept = demo_assets.adapters[0], demo_assets.adapters[1]
        auto = RegistrationRequest(hot.path, "newco", "helper", "v1")
        key = registry.register(auto, "test").revision.key()
        operator = RegistrationRequest(kept.path, "newco", "kept", "v1", warm_policy=WarmPolicy.CPU)
        kept_key = registry.register(operator, "test").revision.key()
        cache.set_warm_policy(kept_key, WarmPolicy.CPU)  # as the upload route applies it
        for _ in range(400):  # 5-minute rate 4/3 per s: over gpu_rps 0.5
            cache.acquire_future(key).result(timeout=60).release()
        assert cache.rebalance() == {key: WarmPolicy.GPU}
        assert cache.ledgers[Tier.L0].entries[key].pinned
        with TestClient(server.app) as http:
            for name in ("helper", "kept"):
                path = f"/admin/revisions/newco/{name}/v1"
                reply = http.put(path, json={"state": "deprecated"}, headers=AUTH)
                assert reply.status_code == 200, reply.text
            assert not cache.ledgers[Tier.L0].entries[key].pinned
            assert cache.holds(key, Tier.L0).warm == frozenset()
            assert cache.rebalance() == {}  # not promoted again from the alias's rates
            assert cache.evict(key, Tier.L0)
            cache.check_integrity()
            # the operator's cpu policy is an operator's act: it stays
            l1 = cache.ledgers[Tier.L1].entries
            assert kept_key in l1 and l1[kept_key].pinned

            # deprecating it again drops nothing more: the owner's pins since still count
            for _ in range(400):
                cache.acquire_future(key).result(timeout=60).release()
            again = http.put(
                "/admin/revisions/newco/helper/v1", json={"state": "deprecated"}, headers=AUTH
            )
            assert again.status_code == 200, again.text
            assert cache.rebalance() == {key: WarmPolicy.GPU}
    finally:
        server.close()


def test_max_auto_gpu_slots_zero_keeps_automatic_promotion_on_cpu(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    server = _server(demo_assets, tmp_path, max_auto_gpu_slots=0)
    try:
        assert server.runtime is not None
        assert server.runtime.cache.config.max_auto_gpu_slots == 0
    finally:
        server.close()
