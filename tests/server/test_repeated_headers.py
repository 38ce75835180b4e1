"""A header the server reads as one value, given twice, is a 400 naming it, before the
credential is checked (hostile tenant, attack round 16).

Starlette's ``headers.get`` returned the first and dropped the rest in silence: an admin key
followed by a tenant's key was served as the admin, a tenant key followed by another tenant's
as the first tenant, whichever one a gateway in front checked or added; the first of two
``X-Request-Id`` or ``X-Session-Id`` headers named the response or picked the revision."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Rig

from loraplex.server.limits import SINGLE_HEADERS

BODY = {"model": "support", "prompt": "hi", "max_tokens": 1}


def _error(reply: Any) -> dict[str, Any]:
    error: dict[str, Any] = reply.json()["error"]
    return error


def test_two_authorization_headers_are_refused_on_the_admin_api(rig: Rig) -> None:
    admin, tenant = rig.admin["Authorization"], rig.headers("acme")["Authorization"]
    for first, second in ((admin, tenant), (tenant, admin)):
        headers = [("Authorization", first), ("Authorization", second)]
        reply = rig.client.get("/admin/adapters", headers=headers)
        assert reply.status_code == 400, reply.text
        assert _error(reply)["param"] == "Authorization"
        assert "given 2 times; expected once" in _error(reply)["message"]
        assert reply.headers["connection"] == "close"


def test_two_tenant_keys_are_refused_before_either_is_served(rig: Rig) -> None:
    acme, globex = rig.headers("acme")["Authorization"], rig.headers("globex")["Authorization"]
    headers = [("Authorization", acme), ("Authorization", globex)]
    reply = rig.client.post("/v1/completions", json=BODY, headers=headers)
    assert reply.status_code == 400 and _error(reply)["param"] == "Authorization"
    assert rig.client.get("/v1/models", headers=headers).status_code == 400
    assert rig.engine.requests == []


@pytest.mark.parametrize(
    "name, values",
    [
        ("X-Request-Id", ("mine-1", "mine-2")),
        ("X-Session-Id", ("s-1", "s-2")),
        ("Content-Type", ("application/json", "text/plain")),
        ("Content-Encoding", ("identity", "gzip")),
    ],
)
def test_other_single_headers_given_twice_are_refused(
    rig: Rig, name: str, values: tuple[str, str]
) -> None:
    headers = [*rig.headers("acme").items(), *((name, value) for value in values)]
    reply = rig.client.post("/v1/completions", json=BODY, headers=headers)
    assert reply.status_code == 400, reply.text
    assert _error(reply)["param"] == name
    assert rig.engine.requests == []


def test_each_header_once_is_served(rig: Rig) -> None:
    once = {"X-Request-Id": "mine-1", "X-Session-Id": "s-1", "Content-Encoding": "identity"}
    reply = rig.client.post("/v1/completions", json=BODY, headers={**rig.headers("acme"), **once})
    assert reply.status_code == 200, reply.text
    assert reply.json()["id"] == "mine-1"
    assert set(SINGLE_HEADERS.values()) >= set(once) | {"Authorization", "Content-Type"}


def test_list_headers_may_repeat(rig: Rig) -> None:
    """Only the headers read as one value are checked: ``Accept`` is a list."""
    headers = [*rig.headers("acme").items(), ("Accept", "application/json"), ("Accept", "*/*")]
    reply = rig.client.post("/v1/completions", json=BODY, headers=headers)
    assert reply.status_code == 200, reply.text
