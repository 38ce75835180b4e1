"""The admin API: tenants, keys, registration (import directory or upload), releases, residency."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ADMIN_KEY, Rig, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient

from loraplex.residency.cache import TieredAdapterCache
from loraplex.server.app import create_app
from loraplex.server.deps import ServerDeps
from loraplex.server.routes_residency import MAX_RESIDENCY_PAGE


def _new_tenant(rig: Rig, name: str) -> dict[str, str]:
    created = rig.client.post("/admin/tenants", json={"name": name}, headers=rig.admin)
    assert created.status_code == 201, created.text
    key = rig.client.post(f"/admin/tenants/{name}/keys", headers=rig.admin).json()
    return {"Authorization": f"Bearer {key['token']}"}


def test_tenants_and_keys(rig: Rig) -> None:
    _new_tenant(rig, "umbrella")
    assert "umbrella" in {
        t["name"] for t in rig.client.get("/admin/tenants", headers=rig.admin).json()
    }
    again = rig.client.post("/admin/tenants", json={"name": "umbrella"}, headers=rig.admin)
    assert again.status_code == 400 and again.json()["error"]["code"] == "invalid_request"
    keys = rig.client.get("/admin/keys", params={"tenant": "umbrella"}, headers=rig.admin).json()
    assert len(keys) == 1 and "token" not in keys[0]
    for missing in (rig.client.post("/admin/tenants/nobody/keys", headers=rig.admin),
                    rig.client.delete("/admin/keys/no-such-key", headers=rig.admin)):  # fmt: skip
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"]["code"] == "not_found"


def test_register_from_the_import_directory_then_serve(rig: Rig) -> None:
    tenant = _new_tenant(rig, "hooli")
    body = {"path": "acme/legal/r1", "tenant": "hooli", "name": "law", "revision": "v1"}
    first = rig.client.post("/admin/adapters", json=body, headers=rig.admin)
    assert first.status_code == 201, first.text
    assert first.json()["revision"]["tenant"] == "hooli"
    repeat = rig.client.post("/admin/adapters", json=body, headers=rig.admin)
    assert repeat.status_code == 200 and repeat.json()["created"] is False
    models = rig.client.get("/v1/models", headers=tenant).json()["data"]
    assert [m["id"] for m in models[1:]] == ["law"]
    reply = rig.client.post("/v1/completions", json={"model": "law", "prompt": "x"}, headers=tenant)
    assert reply.json()["loraplex"]["revision"] == "hooli/law@v1"


@pytest.mark.parametrize("path", ["../../..", "/etc", "acme/../../../manifest.json"])
def test_paths_outside_the_import_directory_are_refused(rig: Rig, path: str) -> None:
    body = {"path": path, "tenant": "acme", "name": "escape", "revision": "v1"}
    response = rig.client.post("/admin/adapters", json=body, headers=rig.admin)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "path"


def _upload(rig: Rig, adapter_dir: Path, **form: str) -> object:
    files = {
        "config": ("adapter_config.json", (adapter_dir / "adapter_config.json").read_bytes()),
        "weights": (
            "adapter_model.safetensors",
            (adapter_dir / "adapter_model.safetensors").read_bytes(),
        ),
    }
    return rig.client.post("/admin/adapters/upload", files=files, data=form, headers=rig.admin)


def test_upload_registers_and_validates(rig: Rig, tmp_path: Path) -> None:
    _new_tenant(rig, "initrode")
    source = rig.served.assets.adapter("globex", "search", "r2").path
    ok = _upload(rig, source, tenant="initrode", name="search", revision="u1", warm_policy="cpu")
    assert ok.status_code == 201, ok.text  # type: ignore[attr-defined]
    assert ok.json()["revision"]["warm_policy"] == "cpu"  # type: ignore[attr-defined]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_bytes((source / "adapter_config.json").read_bytes())
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    bad = _upload(rig, broken, tenant="initrode", name="broken", revision="u1")
    assert bad.status_code == 422  # type: ignore[attr-defined]
    assert bad.json()["error"]["code"] == "invalid_adapter"  # type: ignore[attr-defined]


def test_a_registration_answers_its_warnings(rig: Rig, tmp_path: Path) -> None:
    """An ``exclude_modules`` entry that excludes nothing is registered (PEFT accepts it) and
    said in the answer's ``warnings`` (NOTE: accepted in silence before); none: an empty list."""
    _new_tenant(rig, "warnco")
    source = rig.served.assets.adapter("globex", "search", "r2").path
    plain = _upload(rig, source, tenant="warnco", name="plain", revision="p1")
    assert plain.json()["warnings"] == []  # type: ignore[attr-defined]
    copy = tmp_path / "excluding"
    copy.mkdir()
    (copy / "adapter_model.safetensors").write_bytes(
        (source / "adapter_model.safetensors").read_bytes()
    )
    config = json.loads((source / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(
        json.dumps({**config, "exclude_modules": ["lm_head"]})
    )
    made = _upload(rig, copy, tenant="warnco", name="excl", revision="e1")
    assert made.status_code == 201, made.text  # type: ignore[attr-defined]
    (warning,) = made.json()["warnings"]  # type: ignore[attr-defined]
    assert warning.startswith("exclude_modules entries ['lm_head'] exclude none of the")


def test_an_uploaded_warm_policy_reaches_the_running_cache(rig: Rig) -> None:
    """A warm policy given at registration applies now, as ``PUT /admin/revisions`` does: it
    was recorded only, so a ``gpu`` upload stayed unpinned until the server restarted."""
    _new_tenant(rig, "warmco")
    source = rig.served.assets.adapter("globex", "search", "r1").path
    made = _upload(rig, source, tenant="warmco", name="core", revision="w1", warm_policy="gpu")
    assert made.status_code == 201, made.text  # type: ignore[attr-defined]
    _gpu_warm_then_on_demand(rig, "warmco", "core", "w1")


def test_upload_size_limit(served: Served) -> None:
    deps = make_app_deps(served, FakeEngine(), max_upload_bytes=1000)
    with TestClient(create_app(deps)) as client:
        source = served.assets.adapter("acme", "support", "r1").path
        files = {
            "config": ("c", (source / "adapter_config.json").read_bytes()),
            "weights": ("w", (source / "adapter_model.safetensors").read_bytes()),
        }
        form = {"tenant": "acme", "name": "too-big", "revision": "v1"}
        auth = {"Authorization": f"Bearer {deps.config.admin_key}"}
        response = client.post("/admin/adapters/upload", files=files, data=form, headers=auth)
        assert response.status_code == 413 and "exceeds" in response.json()["error"]["message"]


def test_alias_change_and_rollback(rig: Rig) -> None:
    headers = rig.headers("initech")

    def answered() -> str:
        body = {"model": "review", "prompt": "x"}
        return str(
            rig.client.post("/v1/completions", json=body, headers=headers).json()["loraplex"][
                "revision"
            ]
        )

    assert answered() == "initech/review@r1"
    alias = {"targets": [{"revision": "r2", "weight": 1}]}
    assert (
        rig.client.put(
            "/admin/adapters/initech/review/alias", json=alias, headers=rig.admin
        ).status_code
        == 200
    )
    assert answered() == "initech/review@r2"
    assert (
        rig.client.post("/admin/adapters/initech/review/rollback", headers=rig.admin).status_code
        == 200
    )
    assert answered() == "initech/review@r1"


def _entries(rig: Rig, model: str) -> dict[str, dict[str, object]]:
    listing = rig.client.get("/admin/residency", headers=rig.admin).json()
    return {e["tier"]: e for e in listing["entries"] if e["model"] == model}


def test_pin_evict_unpin_prefetch(rig: Rig) -> None:
    model = "acme/billing@r1"
    pinned = rig.client.post(
        "/admin/residency/pin", json={"model": model, "wait": True}, headers=rig.admin
    )
    assert pinned.json() == {"model": model, "tier": "L0", "status": "resident"}
    assert _entries(rig, model)["L0"]["pinned"] is True
    evict = {"model": model, "tier": "L0"}
    kept = rig.client.post("/admin/residency/evict", json=evict, headers=rig.admin).json()
    # a kept copy says why, so it is not taken for an absent one (both were {"evicted": false}),
    # and which hold kept it (it said "pinned, in use or loading"); this rig's cache has no
    # pin owners (``OwnedPins``), so the pin's owner is not known
    assert (kept["evicted"], kept["reason"]) == (False, "kept: pinned by a pin (owner unknown)")
    rig.client.post("/admin/residency/unpin", json=evict, headers=rig.admin)
    gone = rig.client.post("/admin/residency/evict", json=evict, headers=rig.admin).json()
    assert gone == {"model": model, "tier": "L0", "evicted": True}
    assert "L0" not in _entries(rig, model)
    absent = rig.client.post("/admin/residency/evict", json=evict, headers=rig.admin).json()
    assert (absent["evicted"], absent["reason"]) == (False, "no copy in L0")
    # an alias where a revision is due, or an unknown tier, names its field (param was null)
    for bad, param in (
        ({"model": "acme/billing"}, "model"),
        ({"model": model, "tier": "L4"}, "tier"),
    ):
        refused = rig.client.post("/admin/residency/pin", json=bad, headers=rig.admin)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    fetch = {"model": model, "tier": "cpu", "wait": True}
    assert (
        rig.client.post("/admin/residency/prefetch", json=fetch, headers=rig.admin).status_code
        == 200
    )
    assert _entries(rig, model)["L1"]["ready"] is True
    rig.cache.check_integrity()


def test_residency_names_the_tenant_each_copy_is_charged_to(rig: Rig) -> None:
    """A copy loaded for another tenant's request (a call of a public adapter) counts against
    that tenant's share; the admin listing says so, and the owner's request takes it back."""
    key = rig.served.demo.revisions[0].key()
    model = f"{key.tenant}/{key.name}@{key.revision}"
    caller = next(t for t in ("acme", "globex") if t != key.tenant)
    rig.cache.acquire_future(key, requester=caller).result(timeout=10).release()
    assert _entries(rig, model)["L0"]["charged_to"] == caller
    rig.cache.acquire_future(key, requester=key.tenant).result(timeout=10).release()
    assert _entries(rig, model)["L0"]["charged_to"] == key.tenant
    rig.cache.check_integrity()


def test_warm_policy_reaches_registry_and_cache(rig: Rig) -> None:
    response = rig.client.put(
        "/admin/revisions/globex/summarize/r1", json={"warm_policy": "gpu"}, headers=rig.admin
    )
    assert response.status_code == 200 and response.json()["warm_policy"] == "gpu"
    _gpu_warm_then_on_demand(rig, "globex", "summarize", "r1")


def _gpu_warm_then_on_demand(rig: Rig, tenant: str, name: str, revision: str) -> None:
    """Waits for the ``gpu`` warm policy to have the revision loaded and pinned in L0, then
    sets it back to ``on_demand``."""
    model = f"{tenant}/{name}@{revision}"
    deadline = time.monotonic() + 10
    while not _entries(rig, model).get("L0", {}).get("ready"):
        assert time.monotonic() < deadline, f"gpu warm policy never loaded {model}"
        time.sleep(0.01)
    assert _entries(rig, model)["L0"]["pinned"] is True
    path = f"/admin/revisions/{tenant}/{name}/{revision}"
    rig.client.put(path, json={"warm_policy": "on_demand"}, headers=rig.admin)
    rig.cache.check_integrity()


@pytest.mark.parametrize(
    ("body", "status"),
    [({"model": "acme/support@r1", "tier": "L9"}, 400), ({"model": "acme/ghost@r1"}, 404),
     ({"model": "not a ref"}, 400), ({"model": "acme/support@r1", "extra": 1}, 400)],
)  # fmt: skip
def test_bad_residency_requests(rig: Rig, body: dict[str, object], status: int) -> None:
    response = rig.client.post("/admin/residency/pin", json=body, headers=rig.admin)
    assert response.status_code == status, response.text


def test_residency_lists_hot_adapters(rig: Rig) -> None:
    for _ in range(3):
        rig.cache.acquire_future(rig.served.demo.revisions[0].key()).result(timeout=10).release()
    hot = rig.client.get("/admin/residency", params={"top": 1}, headers=rig.admin).json()["hot"]
    assert hot == [{"model": rig.served.demo.revisions[0].ref, "hits": 2}]


def test_residency_pages_are_capped(rig: Rig) -> None:
    for revision in rig.served.demo.revisions[:3]:
        rig.cache.acquire_future(revision.key()).result(timeout=10).release()
    listing = rig.client.get("/admin/residency", params={"top": 2}, headers=rig.admin).json()
    total = listing["num_entries"]
    assert total >= 3 and len(listing["entries"]) == 2 and len(listing["hot"]) == 2
    rest = rig.client.get("/admin/residency", params={"offset": 2}, headers=rig.admin).json()
    seen = {(e["model"], e["tier"]) for e in listing["entries"] + rest["entries"]}
    assert len(seen) == total  # two pages: every copy once
    too_many = rig.client.get(
        "/admin/residency", params={"top": MAX_RESIDENCY_PAGE + 1}, headers=rig.admin
    )
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "top"


def test_tenant_changes_reach_the_engine_side_through_deps(served: Served) -> None:
    calls: list[str] = []
    deps = replace(make_app_deps(served, FakeEngine()), refresh_tenants=lambda: calls.append("x"))
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with TestClient(create_app(deps)) as client:
        created = client.post("/admin/tenants", json={"name": "refreshco"}, headers=admin)
        assert created.status_code == 201, created.text
        changed = client.put("/admin/tenants/refreshco", json={"priority": "high"}, headers=admin)
        assert changed.status_code == 200, changed.text
    assert calls == ["x", "x"]
    assert isinstance(deps.cache, TieredAdapterCache)
    deps.cache.close()


def test_server_deps_without_the_tenant_hook_are_refused(served: Served) -> None:
    deps = make_app_deps(served, FakeEngine())
    with pytest.raises(TypeError, match="refresh_tenants"):
        ServerDeps(deps.config, deps.engine, deps.registry, deps.cache)  # type: ignore[call-arg]
    assert isinstance(deps.cache, TieredAdapterCache)
    deps.cache.close()


# One wrong type per admin body, each a value pydantic's lax mode would have converted ("yes" to
# True, "1" to 1, 1.0 to 1, true to 1): admin bodies are as strict as tenant bodies.
_R = {"model": "acme/support@r1"}
_RELEASE = {"tenant": "initech", "name": "review", "revision": "r2"}


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        (
            "post",
            "/admin/tenants",
            {"name": "t1", "quotas": {"max_gpu_bytes": "1"}},
            "quotas.max_gpu_bytes",
        ),
        (
            "put",
            "/admin/tenants/acme",
            {"quotas": {"reserved_running_seqs": True}},
            "quotas.reserved_running_seqs",
        ),
        (
            "put",
            "/admin/tenants/acme",
            {"quotas": {"max_requests_per_s": "2.5"}},
            "quotas.max_requests_per_s",
        ),
        (
            "post",
            "/admin/adapters",
            {"path": "acme/legal/r1", "tenant": "acme", "name": "x", "revision": 1},
            "revision",
        ),
        (
            "put",
            "/admin/adapters/initech/review/alias",
            {"targets": [{"revision": "r2", "weight": "1"}]},
            "targets.0.weight",
        ),
        ("put", "/admin/adapters/initech/review/visibility", {"visibility": 1}, "visibility"),
        ("put", "/admin/revisions/initech/review/r2", {"state": 1}, "state"),
        ("post", "/admin/residency/pin", {**_R, "wait": "yes"}, "wait"),
        ("post", "/admin/residency/prefetch", {**_R, "wait": 1}, "wait"),
        ("post", "/admin/residency/unpin", {**_R, "tier": 0}, "tier"),
        ("post", "/admin/residency/evict", {**_R, "wait": "true"}, "wait"),
        ("post", "/admin/releases", {**_RELEASE, "gpu": "yes"}, "gpu"),
        ("post", "/admin/releases", {**_RELEASE, "dwell_s": "5"}, "dwell_s"),
        (
            "post",
            "/admin/releases",
            {**_RELEASE, "thresholds": {"min_requests": 2.0}},
            "thresholds.min_requests",
        ),
        (
            "post",
            "/admin/releases",
            {**_RELEASE, "probes": [{"prompt": "x", "differ_from_stable": 1}]},
            "probes.0.differ_from_stable",
        ),
        ("post", "/v1/load_lora_adapter", {"lora_name": "acme/x", "lora_path": 1}, "lora_path"),
        ("post", "/v1/unload_lora_adapter", {"lora_name": 1}, "lora_name"),
    ],
)
def test_admin_bodies_refuse_lax_types(
    rig: Rig, method: str, path: str, body: dict[str, object], param: str
) -> None:
    response = rig.client.request(method, path, json=body, headers=rig.admin)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text


def test_invalid_tenant_name_names_the_field(rig: Rig) -> None:
    response = rig.client.post("/admin/tenants", json={"name": "no spaces"}, headers=rig.admin)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "name", error
    assert "tenant 'no spaces' is invalid" in error["message"], error
