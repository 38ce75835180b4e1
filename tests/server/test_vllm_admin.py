"""vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter: the admin credential, paths confined
to the import directory, registration + a CPU prefetch, eviction from every tier."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from conftest import ADMIN_KEY, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import CorruptArtifactError, EngineUnavailableError
from loraplex.residency.cache import TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.server.app import create_app
from loraplex.server.pin_owners import RELEASE, OwnedPins

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass
class Ops:
    """An app whose import directory holds one copy of a demo adapter at ``folder``."""

    client: TestClient
    served: Served
    cache: TieredAdapterCache
    pins: OwnedPins  # what the app's routes call (as ``serve/front.py`` wraps the cache)
    import_dir: Path
    tenant: str  # a fresh tenant, so registrations here touch no other test's view
    tenant_auth: dict[str, str]
    folder: str = "team/support"  # the adapter copy, relative to the import directory


def _copy_adapter(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for name in FILES:
        (dest / name).write_bytes((source / name).read_bytes())


@pytest.fixture
def ops(served: Served, tmp_path: Path) -> Iterator[Ops]:
    deps = make_app_deps(served, FakeEngine())
    import_dir = tmp_path / "imports"
    _copy_adapter(served.assets.adapter("acme", "support", "r1").path, import_dir / "team/support")
    deps = replace(deps, config=replace(deps.config, import_dir=import_dir))
    cache = deps.cache
    assert isinstance(cache, TieredAdapterCache)
    pins = OwnedPins(cache)
    deps = replace(deps, cache=pins)
    tenant = f"ops{secrets.token_hex(4)}"
    with TestClient(create_app(deps)) as client:
        assert (
            client.post("/admin/tenants", json={"name": tenant}, headers=ADMIN).status_code == 201
        )
        token = client.post(f"/admin/tenants/{tenant}/keys", headers=ADMIN).json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        yield Ops(client, served, cache, pins, import_dir, tenant, auth)
    cache.close()


def _load(ops: Ops, lora_name: str, lora_path: str) -> dict[str, object]:
    response = ops.client.post(
        LOAD, json={"lora_name": lora_name, "lora_path": lora_path}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def _complete(ops: Ops, model: str) -> dict[str, object]:
    body = {"model": model, "prompt": "hi", "max_tokens": 4}
    response = ops.client.post("/v1/completions", json=body, headers=ops.tenant_auth)
    assert response.status_code == 200, response.text
    loraplex: dict[str, object] = response.json()["loraplex"]
    return loraplex


def test_load_registers_prefetches_and_serves(ops: Ops) -> None:
    ref = f"{ops.tenant}/support@v1"
    loaded = _load(ops, ref, ops.folder)
    assert loaded["model"] == ref and loaded["created"] is True
    assert (loaded["tier"], loaded["status"]) == ("L1", "resident")
    key = ops.served.registry.get_revision(ref).key()
    assert ops.cache.is_resident(key, Tier.L1)
    ops.cache.check_integrity()
    assert _complete(ops, "support@v1")["revision"] == ref
    assert _complete(ops, "support")["revision"] == ref  # the first revision gets the alias
    again = _load(ops, ref, ops.folder)
    assert again["model"] == ref and again["created"] is False
    assert loaded["warnings"] == again["warnings"] == []  # the registration's (none here)


def test_a_load_the_engine_refuses_at_once_says_the_revision_is_registered(
    ops: Ops, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine process that is starting refuses every call at once (ChildGate): the load was a
    # 503 engine_unavailable, yet the revision was registered (a retry said created: false).
    ref = f"{ops.tenant}/support@v1"
    starting = EngineUnavailableError("the engine process is starting; retry shortly")
    monkeypatch.setattr(ops.cache, "prefetch", _raiser(starting))
    loaded = _load(ops, ref, ops.folder)
    assert (loaded["model"], loaded["created"], loaded["status"]) == (ref, True, "deferred")
    assert f"{ref}: registered; not loaded now (the engine process is starting" in str(
        loaded["message"]
    )
    # Any other failure after the registration says the registration stays.
    monkeypatch.setattr(ops.cache, "prefetch", _raiser(CorruptArtifactError("bad bytes")))
    reply = ops.client.post(LOAD, json={"lora_name": ref, "lora_path": ops.folder}, headers=ADMIN)
    assert reply.status_code >= 400, reply.text
    assert f"{ref} is registered all the same (created: false)" in reply.json()["error"]["message"]
    monkeypatch.undo()
    assert _complete(ops, "support@v1")["revision"] == ref  # loaded on first request
    again = _load(ops, ref, ops.folder)
    assert (again["created"], again["status"]) == (False, "resident")
    ops.cache.check_integrity()


def _raiser(exc: Exception) -> Callable[[AdapterKey, Tier], Future[None]]:
    def raise_it(key: AdapterKey, tier: Tier) -> Future[None]:
        raise exc

    return raise_it


def test_load_without_a_revision_labels_it_by_content(ops: Ops) -> None:
    weights = (ops.import_dir / ops.folder / FILES[1]).read_bytes()
    label = "sha256-" + hashlib.sha256(weights).hexdigest()[:16]
    absolute = str((ops.import_dir / ops.folder).absolute())  # as vLLM scripts send it
    loaded = _load(ops, f"{ops.tenant}/support", absolute)
    assert loaded["model"] == f"{ops.tenant}/support@{label}"
    assert _load(ops, f"{ops.tenant}/support", ops.folder)["created"] is False


def test_a_load_answers_the_registration_warnings(ops: Ops) -> None:
    """An ``exclude_modules`` entry that excludes nothing: loaded, and said in ``warnings``."""
    folder = ops.import_dir / "team/excluding"
    _copy_adapter(ops.import_dir / ops.folder, folder)
    config = folder / FILES[0]
    body = json.loads(config.read_text())
    config.write_text(json.dumps({**body, "exclude_modules": ["lm_head"]}))
    loaded = _load(ops, f"{ops.tenant}/excluding@v1", "team/excluding")
    assert loaded["status"] == "resident"
    (warning,) = loaded["warnings"]  # type: ignore[misc]
    assert str(warning).startswith("exclude_modules entries ['lm_head'] exclude none of the")


def _refused(ops: Ops, route: str, body: Mapping[str, object], status: int = 400) -> dict[str, str]:
    response = ops.client.post(route, json=body, headers=ADMIN)
    assert response.status_code == status, response.text
    error: dict[str, str] = response.json()["error"]
    return error


def _escapes(ops: Ops, outside: Path) -> dict[str, str]:
    """lora_path values that would read ``outside`` (a copy of an adapter outside the import
    directory), each through another way out."""
    _copy_adapter(ops.import_dir / ops.folder, outside)
    (ops.import_dir / "dirlink").symlink_to(outside, target_is_directory=True)
    linked = ops.import_dir / "filelinks"
    linked.mkdir()
    (linked / FILES[0]).write_bytes((outside / FILES[0]).read_bytes())
    (linked / FILES[1]).symlink_to(outside / FILES[1])
    hard = ops.import_dir / "hardlink"
    hard.mkdir()
    (hard / FILES[0]).write_bytes((outside / FILES[0]).read_bytes())
    os.link(outside / FILES[1], hard / FILES[1])
    return {
        "dotdot": "../outside",
        "dotdot_inside": f"{ops.folder}/../../../outside",
        "absolute": str(outside),
        "absolute_via_import_dir": f"{ops.import_dir.absolute()}/../outside",
        "dirlink": "dirlink",
        "filelink": "filelinks",
        "hardlink": "hardlink",
    }


def test_lora_path_stays_inside_the_import_directory(ops: Ops, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    for way, lora_path in _escapes(ops, outside).items():
        body = {"lora_name": f"{ops.tenant}/{way}@v1", "lora_path": lora_path}
        error = _refused(ops, LOAD, body)
        assert error["param"] == "lora_path", (way, error)
        assert str(outside) not in error["message"] or way == "absolute", (way, error)
        assert str(ops.import_dir) not in error["message"].replace(lora_path, ""), (way, error)
    assert ops.served.registry.list_adapters(ops.tenant) == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"lora_name": "no-tenant", "lora_path": "x"}, "lora_name"),
        ({"lora_name": "acme/../x", "lora_path": "x"}, "lora_name"),
        ({"lora_name": "acme/x@", "lora_path": "x"}, "lora_name"),
        ({"lora_name": "acme/x", "lora_path": "x", "lora_int_id": 3}, "lora_int_id"),
        ({"lora_name": "acme/x"}, "lora_path"),
    ],
)
def test_bad_bodies_name_the_field(ops: Ops, body: dict[str, object], param: str) -> None:
    assert _refused(ops, LOAD, body)["param"] == param


def test_an_unknown_tenant_or_folder_is_a_clear_400(ops: Ops) -> None:
    unknown_tenant = _refused(ops, LOAD, {"lora_name": "nobody-x/a", "lora_path": ops.folder})
    assert "nobody-x" in unknown_tenant["message"]
    missing = {"lora_name": f"{ops.tenant}/a", "lora_path": "no/such/folder"}
    assert "expected a directory in the import directory" in _refused(ops, LOAD, missing)["message"]


def test_an_invalid_adapter_is_a_422(ops: Ops) -> None:
    broken = ops.import_dir / "broken"
    broken.mkdir()
    (broken / FILES[0]).write_text("{}")
    (broken / FILES[1]).write_bytes(b"not safetensors")
    body = {"lora_name": f"{ops.tenant}/broken@v1", "lora_path": "broken"}
    assert _refused(ops, LOAD, body, 422)["code"] == "invalid_adapter"


@pytest.mark.parametrize("route", [LOAD, UNLOAD])
def test_only_the_admin_credential_may_load_or_unload(ops: Ops, route: str) -> None:
    body = {"lora_name": f"{ops.tenant}/support@v1", "lora_path": ops.folder}
    if route == UNLOAD:
        del body["lora_path"]
    for headers in ({}, ops.tenant_auth, {"Authorization": f"Bearer {ops.served.keys['acme']}"}):
        response = ops.client.post(route, json=body, headers=headers)
        assert response.status_code == 401, response.text
    assert ops.served.registry.list_adapters(ops.tenant) == []


def test_unload_evicts_every_tier_and_keeps_the_revision(ops: Ops) -> None:
    ref = f"{ops.tenant}/support@v1"
    _load(ops, ref, ops.folder)
    key = ops.served.registry.get_revision(ref).key()
    held = [t.name for t in (Tier.L0, Tier.L1, Tier.L2) if ops.cache.is_resident(key, t)]
    assert "L1" in held
    response = ops.client.post(UNLOAD, json={"lora_name": f"{ops.tenant}/support"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["evicted"] == {ref: held}
    assert not any(ops.cache.is_resident(key, t) for t in (Tier.L0, Tier.L1, Tier.L2))
    ops.cache.check_integrity()
    assert ops.served.registry.get_revision(ref).key() == key  # still registered
    assert _complete(ops, "support@v1")["revision"] == ref  # and served (loaded on demand)


def test_unload_of_a_pinned_copy_is_a_409(ops: Ops) -> None:
    ref = f"{ops.tenant}/support@v1"
    _load(ops, ref, ops.folder)
    key = ops.served.registry.get_revision(ref).key()
    ops.cache.pin(key, Tier.L1).result(timeout=30)
    try:
        error = _refused(ops, UNLOAD, {"lora_name": ref}, 409)
        assert error["code"] == "adapter_in_use" and f"{ref} in L1" in error["message"]
        # who lifts which pin: an operator's unpin does not lift a warm policy's or a release's
        assert "POST /admin/residency/unpin" in error["message"]
        assert '{"warm_policy": "on_demand"}' in error["message"]
        assert ops.cache.is_resident(key, Tier.L1)
    finally:
        ops.cache.unpin(key, Tier.L1)


def test_an_unload_409_names_what_holds_each_kept_copy(ops: Ops) -> None:
    """Per tier, as a kept ``/admin/residency/evict`` does: whose pin (the operator's, a
    release's), how many leases use the copy. It named the tiers only."""
    ref = f"{ops.tenant}/support@v1"
    _load(ops, ref, ops.folder)
    key = ops.served.registry.get_revision(ref).key()
    ops.pins.pin(key, Tier.L1).result(timeout=30)  # the operator's
    ops.pins.pin(key, Tier.L1, RELEASE).result(timeout=30)  # and a release's hold
    leases = [ops.cache.acquire_future(key).result(timeout=30) for _ in range(2)]
    try:
        message = _refused(ops, UNLOAD, {"lora_name": ref}, 409)["message"]
        kept = f"{ref} in L0 (in use (2 leases or loads)), L1 (pinned by operator, release)"
        assert kept in message, message
        assert ops.cache.is_resident(key, Tier.L0) and ops.cache.is_resident(key, Tier.L1)
        for lease in leases:
            lease.release()
        ops.pins.unpin(key, Tier.L1)  # the operator lets go; the release holds it still
        message = _refused(ops, UNLOAD, {"lora_name": ref}, 409)["message"]
        assert f"{ref} in L1 (pinned by release)" in message and "L0" not in message, message
        assert not ops.cache.is_resident(key, Tier.L0)  # the free copy went
        ops.cache.pin(key, Tier.L2).result(timeout=30)  # made around ``OwnedPins``: no owner
        message = _refused(ops, UNLOAD, {"lora_name": ref}, 409)["message"]
        assert "L2 (pinned by a pin (owner unknown))" in message, message
    finally:
        ops.pins.unpin(key, Tier.L1, RELEASE)
        ops.cache.unpin(key, Tier.L2)
    ops.cache.check_integrity()


def test_unload_of_an_unknown_adapter_is_a_404(ops: Ops) -> None:
    for lora_name in (f"{ops.tenant}/nothing", f"{ops.tenant}/nothing@v1"):
        error = _refused(ops, UNLOAD, {"lora_name": lora_name}, 404)
        assert (error["code"], error["param"]) == ("not_found", "lora_name")
    assert ops.served.registry.list_adapters(ops.tenant) == []  # nothing was made up


def test_load_without_an_import_directory_is_refused(served: Served) -> None:
    """Both routes by server path name the setting that turns them on (they said only "no
    import directory", and the admin route named no field)."""
    deps = make_app_deps(served, FakeEngine())
    deps = replace(deps, config=replace(deps.config, import_dir=None))
    with TestClient(create_app(deps)) as client:
        body = {"lora_name": "acme/x@v1", "lora_path": "acme/support/r1"}
        load = client.post(LOAD, json=body, headers=ADMIN)
        body = {"path": "acme/support/r1", "tenant": "acme", "name": "x", "revision": "v1"}
        register = client.post("/admin/adapters", json=body, headers=ADMIN)
    assert isinstance(deps.cache, TieredAdapterCache)
    deps.cache.close()
    for response, param in ((load, "lora_path"), (register, "path")):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param
        assert "--import-dir" in error["message"] and "import_dir" in error["message"]
        assert "`fleet up --config`" in error["message"]  # a fleet's operator reads it too
    assert "x" not in {adapter.name for adapter in served.registry.list_adapters("acme")}


def _unload(ops: Ops, lora_name: str, query: str = "") -> dict[str, object]:
    response = ops.client.post(f"{UNLOAD}{query}", json={"lora_name": lora_name}, headers=ADMIN)
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def test_unload_without_a_revision_pages_its_revisions(ops: Ops) -> None:
    """Every revision in one answer (and three cache calls each) grew without bound: revisions
    are never deleted. One page of them, ``?limit=&after=`` as the admin listings page."""
    refs = [f"{ops.tenant}/support@v{i}" for i in (1, 2, 3)]
    for ref in refs:
        _load(ops, ref, ops.folder)
    keys = [ops.served.registry.get_revision(ref).key() for ref in refs]
    name = f"{ops.tenant}/support"
    first = _unload(ops, name, "?limit=2")
    assert list(first["evicted"]) == refs[:2] and first["next_after"] == "v2"  # type: ignore[call-overload]
    assert "call again with ?after=v2" in str(first["message"])
    assert [ops.cache.is_resident(key, Tier.L1) for key in keys] == [False, False, True]
    last = _unload(ops, name, "?limit=2&after=v2")
    assert list(last["evicted"]) == refs[2:] and last["next_after"] is None  # type: ignore[call-overload]
    assert not any(ops.cache.is_resident(key, Tier.L1) for key in keys)
    whole = _unload(ops, name)  # the first 100: all of them, the last page
    assert list(whole["evicted"]) == refs and whole["next_after"] is None  # type: ignore[call-overload]
    assert _unload(ops, refs[0])["next_after"] is None  # one revision: no paging


def test_unload_paging_is_refused_with_a_revision_or_a_bad_cursor(ops: Ops) -> None:
    ref = f"{ops.tenant}/support@v1"
    _load(ops, ref, ops.folder)
    for query, param in (("?limit=2", "limit"), ("?after=v1", "after")):
        response = ops.client.post(f"{UNLOAD}{query}", json={"lora_name": ref}, headers=ADMIN)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and "naming a revision" in error["message"]
    for query, param in (("?limit=1001", "limit"), ("?limit=0", "limit"), ("?after=v9", "after")):
        response = ops.client.post(
            f"{UNLOAD}{query}", json={"lora_name": f"{ops.tenant}/support"}, headers=ADMIN
        )
        assert response.status_code == 400, (query, response.text)
        assert response.json()["error"]["param"] == param
    assert ops.cache.is_resident(ops.served.registry.get_revision(ref).key(), Tier.L1)
