"""The admin listings' ``tenant=`` filter: a tenant that does not exist is the 404 naming it that
every other admin route answers for an unknown tenant. It was an empty list, as if the tenant
existed and had no keys, adapters or releases: a typo read as "nothing there"."""

from __future__ import annotations

import pytest
from conftest import Rig

LISTINGS = ("/admin/keys", "/admin/adapters", "/admin/releases")


@pytest.mark.parametrize("path", LISTINGS)
@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("tenant=nobody", "'nobody'"),
        ("tenant=%FF", "'\ufffd'"),  # not UTF-8: read as U+FFFD, which names no tenant
        ("tenant=nobody&limit=5", "'nobody'"),
    ],
)
def test_a_listing_of_an_unknown_tenant_is_a_404_naming_it(
    rig: Rig, path: str, query: str, shown: str
) -> None:
    reply = rig.client.get(f"{path}?{query}", headers=rig.admin)

    assert reply.status_code == 404, reply.text
    error = reply.json()["error"]
    assert error["code"] == "not_found"
    assert error["message"] == f"tenant {shown} does not exist"


def test_the_404_is_the_one_other_admin_routes_give(rig: Rig) -> None:
    listed = rig.client.get("/admin/keys?tenant=nobody", headers=rig.admin)
    keyed = rig.client.post("/admin/tenants/nobody/keys", headers=rig.admin)

    assert keyed.status_code == listed.status_code == 404
    assert keyed.json() == listed.json()


@pytest.mark.parametrize("path", LISTINGS)
def test_a_known_tenant_with_nothing_listed_is_an_empty_list(rig: Rig, path: str) -> None:
    name = f"quiet{LISTINGS.index(path)}"  # the registry outlives the test
    created = rig.client.post("/admin/tenants", json={"name": name}, headers=rig.admin)
    assert created.status_code == 201, created.text

    reply = rig.client.get(f"{path}?tenant={name}", headers=rig.admin)

    assert reply.status_code == 200, reply.text
    assert reply.json() == []


@pytest.mark.parametrize("path", ("/admin/keys", "/admin/adapters"))
def test_a_known_tenants_listing_is_its_rows(rig: Rig, path: str) -> None:
    reply = rig.client.get(f"{path}?tenant=acme", headers=rig.admin)

    assert reply.status_code == 200, reply.text
    rows = reply.json()
    assert rows and {row["tenant"] for row in rows} == {"acme"}
