"""Tenant keys and the admin credential: who may call what."""

from __future__ import annotations

import pytest
from conftest import ADMIN_KEY, Rig

from loraplex.server.auth import (
    ADMIN_KEY_ON_TENANT_ROUTE,
    ADMIN_NO_KEY,
    NO_KEY,
    admin_key_matches,
)
from loraplex.server.deps import ServerConfig

ADMIN_ROUTES = [
    ("GET", "/admin/tenants"),
    ("GET", "/admin/keys"),
    ("GET", "/admin/adapters"),
    ("GET", "/admin/residency"),
    ("POST", "/admin/tenants/acme/keys"),
    ("POST", "/admin/residency/pin"),
    ("GET", "/metrics"),
]


def _completion(rig: Rig, headers: dict[str, str]) -> int:
    body = {"model": "support", "prompt": "hi", "max_tokens": 2}
    return rig.client.post("/v1/completions", json=body, headers=headers).status_code


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Bearer lpx_nope", "Basic abc", f"Bearer {ADMIN_KEY}"],
)
def test_tenant_routes_refuse_missing_bad_and_admin_credentials(
    rig: Rig, header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    response = rig.client.get("/v1/models", headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.headers["www-authenticate"] == "Bearer"
    assert _completion(rig, headers) == 401
    assert rig.engine.requests == []
    # what to send instead, where the caller can be told: no key, or the admin key
    told = {
        None: NO_KEY,
        "Bearer": NO_KEY,
        "Basic abc": NO_KEY,
        f"Bearer {ADMIN_KEY}": ADMIN_KEY_ON_TENANT_ROUTE,
    }
    assert response.json()["error"]["message"] == told.get(header, "invalid API key")


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_admin_routes_refuse_every_tenant_key(rig: Rig, method: str, path: str) -> None:
    for tenant in rig.served.keys:
        response = rig.client.request(method, path, headers=rig.headers(tenant), json={})
        assert response.status_code == 401, (tenant, path)
        assert response.json()["error"]["message"] == "invalid admin credential"
    keyless = rig.client.request(method, path, json={})
    assert keyless.status_code == 401
    # told what to send, as a tenant route is (it was "invalid admin credential" too)
    assert keyless.json()["error"]["message"] == ADMIN_NO_KEY


def test_metrics_without_a_key_is_told_what_to_send(rig: Rig) -> None:
    keyless = rig.client.get("/metrics")
    assert keyless.status_code == 401
    assert keyless.json()["error"]["message"] == ADMIN_NO_KEY
    wrong = rig.client.get("/metrics", headers=rig.headers("acme"))
    assert wrong.json()["error"]["message"] == "invalid admin credential"
    assert rig.client.get("/metrics", headers=rig.admin).status_code == 200


def test_admin_credential_opens_admin_routes(rig: Rig) -> None:
    assert rig.client.get("/admin/tenants", headers=rig.admin).status_code == 200


def test_revoked_key_stops_at_once(rig: Rig) -> None:
    issued = rig.client.post("/admin/tenants/initech/keys", headers=rig.admin).json()
    headers = {"Authorization": f"Bearer {issued['token']}"}
    assert rig.client.get("/v1/models", headers=headers).status_code == 200
    revoked = rig.client.delete(f"/admin/keys/{issued['key_id']}", headers=rig.admin)
    assert revoked.status_code == 200
    assert rig.client.get("/v1/models", headers=headers).status_code == 401


def test_a_key_revoked_outside_the_server_is_refused_at_once_even_over_its_rate(
    rig: Rig,
) -> None:
    """``loraplex keys revoke`` (another process, another replica's /admin) writes the database
    only: nothing tells this server. The next request is a 401, even from a tenant the
    listener would refuse with a 429 (the refusal path a cache of verified keys would shorten,
    ``auth.authenticate``'s NOTE)."""
    created = rig.client.post("/admin/tenants", json={"name": "revoked-co"}, headers=rig.admin)
    assert created.status_code in (200, 201)
    quotas = {"quotas": {"max_requests_per_s": 0.01}}  # one request, then one every 100 s
    assert rig.client.put("/admin/tenants/revoked-co", json=quotas, headers=rig.admin).is_success
    issued = rig.client.post("/admin/tenants/revoked-co/keys", headers=rig.admin).json()
    headers = {"Authorization": f"Bearer {issued['token']}"}
    assert rig.client.get("/v1/models", headers=headers).status_code == 200
    assert rig.client.get("/v1/models", headers=headers).status_code == 429  # over its rate
    rig.served.registry.revoke_key(issued["key_id"], "cli")  # not through this server's routes
    refused = rig.client.get("/v1/models", headers=headers)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_admin_key_comparison() -> None:
    assert admin_key_matches(ADMIN_KEY, ADMIN_KEY)
    assert not admin_key_matches(ADMIN_KEY + "x", ADMIN_KEY)
    assert not admin_key_matches("", ADMIN_KEY)


@pytest.mark.parametrize("key", ["short", "lpx_0123456789abcdef_looks_like_a_tenant_key"])
def test_admin_key_must_be_long_and_unlike_tenant_keys(key: str) -> None:
    with pytest.raises(ValueError, match="admin_key"):
        ServerConfig(base_model_name="m", admin_key=key)
