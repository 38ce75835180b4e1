"""A separate admin listener: /admin and /metrics answer only on it, the OpenAI API only on the
public one, /health and /ready on both; the wrong socket looks like a missing path."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from conftest import ADMIN_KEY, Served, make_app_deps
from fakes import FakeEngine

import loraplex
from loraplex.serve.config import ServeConfig
from loraplex.server.app import create_app
from loraplex.server.listeners import bind_all, guarded


@pytest.fixture
def urls(served: Served) -> Iterator[tuple[str, str]]:
    deps = make_app_deps(served, FakeEngine())
    sockets = bind_all("127.0.0.1", 0, None, 0)
    config = uvicorn.Config(guarded(create_app(deps), sockets), log_level="warning",
                            lifespan="off")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    public, admin = (f"http://127.0.0.1:{s.getsockname()[1]}" for s in sockets)
    try:
        yield public, admin
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert deps.cache is not None
        deps.cache.close()


def test_routes_split_between_the_public_and_the_admin_socket(
    urls: tuple[str, str], served: Served
) -> None:
    public, admin = urls
    admin_auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    tenant_auth = {"Authorization": f"Bearer {served.keys['acme']}"}
    assert httpx.get(f"{admin}/admin/tenants", headers=admin_auth).status_code == 200
    assert httpx.get(f"{admin}/metrics", headers=admin_auth).status_code == 200
    hidden = httpx.get(f"{public}/admin/tenants", headers=admin_auth)
    missing = httpx.get(f"{public}/admin/no-such-route", headers=admin_auth)
    assert hidden.status_code == 404 and hidden.json() == missing.json()
    assert httpx.get(f"{public}/metrics", headers=admin_auth).status_code == 404
    assert httpx.get(f"{public}/v1/models", headers=tenant_auth).status_code == 200
    assert httpx.get(f"{admin}/v1/models", headers=tenant_auth).status_code == 404
    assert httpx.get(f"{admin}/admin/tenants", headers=tenant_auth).status_code == 401
    for url in (public, admin):
        assert httpx.get(f"{url}/health").status_code == 200


def test_admin_listener_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="admin_port 8000 is invalid"):
        ServeConfig(data_dir=".", port=8000, admin_port=8000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="admin_host is set without admin_port"):
        ServeConfig(data_dir=".", admin_host="10.0.0.1")  # type: ignore[arg-type]
    ServeConfig(data_dir=".", port=8000, admin_port=8000, admin_host="10.0.0.1")  # type: ignore[arg-type]


def test_a_busy_admin_port_closes_the_public_socket_too() -> None:
    taken = bind_all("127.0.0.1", 0, None, None)[0]
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError):
            bind_all("127.0.0.1", 0, None, port)
    finally:
        taken.close()


@pytest.mark.parametrize("route", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"])
def test_vllm_adapter_routes_answer_only_on_the_admin_socket(
    urls: tuple[str, str], served: Served, route: str
) -> None:
    public, admin = urls
    admin_auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"lora_name": "no-tenant-given", "lora_path": "x"}
    if route.endswith("unload_lora_adapter"):
        del body["lora_path"]
    reached = httpx.post(f"{admin}{route}", json=body, headers=admin_auth)
    assert reached.status_code == 400 and reached.json()["error"]["param"] == "lora_name"
    tenant_auth = {"Authorization": f"Bearer {served.keys['acme']}"}
    for headers in (admin_auth, tenant_auth):
        hidden = httpx.post(f"{public}{route}", json=body, headers=headers)
        missing = httpx.post(f"{public}/v1/no-such-route", json=body, headers=tenant_auth)
        assert hidden.status_code == missing.status_code == 404
        assert hidden.json() == missing.json()
    for headers in ({}, tenant_auth):
        assert httpx.post(f"{admin}{route}", json=body, headers=headers).status_code == 401


def test_openapi_documents_and_version_by_socket(urls: tuple[str, str]) -> None:
    public, admin = urls
    admin_auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    tenant_doc = httpx.get(f"{public}/openapi.json")
    assert tenant_doc.status_code == 200
    assert "/v1/completions" in tenant_doc.json()["paths"]
    assert httpx.get(f"{admin}/openapi.json").status_code == 404
    admin_doc = httpx.get(f"{admin}/admin/openapi.json", headers=admin_auth)
    assert admin_doc.status_code == 200 and "/v1/load_lora_adapter" in admin_doc.json()["paths"]
    assert httpx.get(f"{admin}/admin/openapi.json").status_code == 401
    assert httpx.get(f"{public}/admin/openapi.json", headers=admin_auth).status_code == 404
    for url in (public, admin):
        assert httpx.get(f"{url}/version").json() == {"version": loraplex.__version__}


def test_a_trailing_slash_is_not_redirected_so_hidden_routes_stay_hidden(
    urls: tuple[str, str], served: Served
) -> None:
    """FastAPI's slash redirect answered ``/metrics/`` with a 307 to ``/metrics`` on the public
    socket while an unknown ``/v1/nope/`` got a 404: the redirect told a tenant that the admin
    route exists. Without redirects both are the same 404."""
    public, _ = urls
    tenant = {"Authorization": f"Bearer {served.keys['acme']}"}
    with httpx.Client(base_url=public, headers=tenant, follow_redirects=False) as http:
        missing = http.post("/v1/nope/")
        assert missing.status_code == 404
        for path in ("/metrics/", "/v1/load_lora_adapter/", "/admin/tenants/"):
            hidden = http.post(path)
            assert (hidden.status_code, hidden.json()) == (404, missing.json()), path
