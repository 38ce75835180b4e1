"""An admin write to a SQLite registry whose write lock another process holds (a CLI command,
another server on the same file) is a 503 ``registry_unavailable`` with Retry-After once
``sqlite.WRITE_TIMEOUT_S`` has passed; reads go on beside the lock (``sqlite_lock``: a real
lock, taken by a child process)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conftest import Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from sqlite_lock import write_lock_held

from loraplex.registry import RegistryConfig, open_registry
from loraplex.registry.config import DATABASE_FILE
from loraplex.server.app import create_app


def test_an_admin_write_behind_another_process_lock_is_a_503(
    served: Served, tmp_path: Path
) -> None:
    """NOTE: it waited 30 s, then answered 500 ``internal_error`` (sqlite3's bare "database
    is locked")."""
    registry = open_registry(RegistryConfig(tmp_path))
    deps = make_app_deps(replace(served, registry=registry), FakeEngine())
    auth = {"Authorization": f"Bearer {deps.config.admin_key}"}
    with TestClient(create_app(deps)) as client:
        with write_lock_held(tmp_path / DATABASE_FILE):
            reply = client.post("/admin/tenants", json={"name": "umbrella"}, headers=auth)
            assert client.get("/admin/tenants", headers=auth).status_code == 200  # reads go on
        created = client.post("/admin/tenants", json={"name": "umbrella"}, headers=auth)
    assert reply.status_code == 503, reply.text
    assert reply.json()["error"]["code"] == "registry_unavailable"
    assert "another process held its write lock for 10 s" in reply.json()["error"]["message"]
    assert int(reply.headers["Retry-After"]) >= 1
    assert created.status_code == 201, created.text  # the lock released: the write goes on
    assert deps.cache is not None
    deps.cache.close()
    registry.close()
