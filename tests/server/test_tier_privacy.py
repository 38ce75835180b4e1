"""The tier an adapter sat in is told only to the tenant that owns it: for another tenant's public
adapter it would say whether someone else has been using that adapter lately (a resident copy
means recent traffic), so that caller's answer has no tier (header absent, field null)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Rig

from loraplex.registry import Visibility
from loraplex.residency.ledger import Tier

TIER_HEADER = "x-loraplex-tier"
OWNER, NAME = "globex", "search"


@pytest.fixture
def shared(rig: Rig) -> Iterator[Rig]:
    """``globex/search`` public for one test (the registry is shared by the session)."""
    registry = rig.served.registry
    registry.set_visibility(OWNER, NAME, Visibility.PUBLIC, "test")
    try:
        yield rig
    finally:
        registry.set_visibility(OWNER, NAME, Visibility.PRIVATE, "test")


def _post(rig: Rig, tenant: str, **body: Any) -> Any:
    return rig.client.post("/v1/completions", json=body, headers=rig.headers(tenant))


def _chunks(text: str) -> list[dict[str, Any]]:
    lines = [x.removeprefix("data: ") for x in text.split("\n\n") if x]
    return [json.loads(x) for x in lines[:-1]]


def test_another_tenants_public_adapter_has_no_tier(shared: Rig) -> None:
    shared.engine.running = (shared.served.registry.resolve(OWNER, f"{OWNER}/{NAME}"),)
    response = _post(shared, "acme", model=f"{OWNER}/{NAME}", prompt="hi", max_tokens=4)
    assert response.status_code == 200
    assert response.json()["loraplex"]["revision"].startswith(f"{OWNER}/{NAME}@")
    assert response.json()["loraplex"]["tier"] is None
    assert TIER_HEADER not in response.headers


def test_streamed_chunks_of_a_shared_adapter_have_no_tier(shared: Rig) -> None:
    shared.engine.running = (shared.served.registry.resolve(OWNER, f"{OWNER}/{NAME}"),)
    body = {"model": f"{OWNER}/{NAME}", "prompt": "hi", "max_tokens": 4, "stream": True}
    response = _post(shared, "acme", **body)
    assert response.status_code == 200 and TIER_HEADER not in response.headers
    chunks = _chunks(response.text)
    assert chunks and {c["loraplex"]["tier"] for c in chunks} == {None}


def test_the_engines_tier_is_not_told_either(shared: Rig) -> None:
    """The tier the engine reports on its first delta replaces the arrival view: hidden too."""
    shared.engine.leased_from = Tier.L1
    response = _post(shared, "acme", model=f"{OWNER}/{NAME}", prompt="hi", max_tokens=4)
    assert response.status_code == 200
    assert response.json()["loraplex"]["tier"] is None
    assert TIER_HEADER not in response.headers


def test_the_owner_still_sees_its_tier(shared: Rig) -> None:
    shared.engine.running = (shared.served.registry.resolve(OWNER, NAME),)
    response = _post(shared, OWNER, model=NAME, prompt="hi", max_tokens=4)
    assert response.json()["loraplex"]["tier"] == "L0" and response.headers[TIER_HEADER] == "L0"
