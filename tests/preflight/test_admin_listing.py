"""``Deployment.admin_listing``: a paged admin listing read page by page up to a bound, and a
server that does not page (it answers everything at once) read once, not again and again."""

from __future__ import annotations

import httpx
import pytest

from loraplex.preflight import client as preflight_client
from loraplex.preflight.client import Deployment, PreflightError

ROWS = [{"tenant": "t", "name": f"a{i}"} for i in range(5)]


def _server(paged: bool, calls: list[dict[str, str]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        calls.append(params)
        if not paged:
            return httpx.Response(200, json=ROWS)
        start = 0
        if "after" in params:
            start = [f"t/{r['name']}" for r in ROWS].index(params["after"]) + 1
        return httpx.Response(200, json=ROWS[start : start + int(params["limit"])])

    return httpx.MockTransport(handle)


def _listing(paged: bool, most: int, calls: list[dict[str, str]]) -> list[object]:
    deployment = Deployment("http://test", "admin", 5.0)
    deployment._http = httpx.Client(base_url="http://test", transport=_server(paged, calls))
    try:
        return deployment.admin_listing("/admin/adapters", lambda r: f"t/{r['name']}", most)
    finally:
        deployment.close()


def test_pages_until_the_bound_or_the_last_page(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(preflight_client, "ADMIN_PAGE", 2)
    calls: list[dict[str, str]] = []
    assert _listing(True, 100, calls) == ROWS
    assert calls == [
        {"limit": "2"},
        {"after": "t/a1", "limit": "2"},
        {"after": "t/a3", "limit": "2"},
    ]
    calls.clear()
    assert _listing(True, 3, calls) == ROWS[:3]  # the bound: no page past it
    assert [c["limit"] for c in calls] == ["2", "1"]


def test_a_server_that_does_not_page_is_read_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(preflight_client, "ADMIN_PAGE", 2)
    calls: list[dict[str, str]] = []
    assert _listing(False, 4, calls) == ROWS[:4]
    assert len(calls) == 1


def test_an_adapter_is_read_with_every_revision_page_by_page(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``GET /admin/adapters/{tenant}/{name}`` answers one page of revisions: the preflight
    reads the rest (its checks look for alias targets and warm policies among all of them)."""
    monkeypatch.setattr(preflight_client, "ADMIN_PAGE", 2)
    revisions = [{"revision": f"v{i}"} for i in range(5)]
    calls: list[dict[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        calls.append(params)
        names = [r["revision"] for r in revisions]
        start = names.index(params["after"]) + 1 if "after" in params else 0
        page = revisions[start : start + int(params["limit"])]
        return httpx.Response(200, json={"adapter": {}, "alias": None, "revisions": page})

    deployment = Deployment("http://test", "admin", 5.0)
    deployment._http = httpx.Client(base_url="http://test", transport=httpx.MockTransport(handle))
    try:
        shown = deployment.admin_adapter("t", "a")
    finally:
        deployment.close()
    assert shown == {"adapter": {}, "alias": None, "revisions": revisions}
    assert calls == [{"limit": "2"}, {"limit": "2", "after": "v1"}, {"limit": "2", "after": "v3"}]


def test_a_server_answering_the_first_revisions_again_is_an_error_not_a_loop(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An older server that ignores ``after`` answers the same full page every time: reading
    on would never end, so the preflight stops with an error naming the route."""
    monkeypatch.setattr(preflight_client, "ADMIN_PAGE", 2)
    calls: list[dict[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(dict(request.url.params))
        page = [{"revision": "v0"}, {"revision": "v1"}]
        return httpx.Response(200, json={"adapter": {}, "alias": None, "revisions": page})

    deployment = Deployment("http://test", "admin", 5.0)
    deployment._http = httpx.Client(base_url="http://test", transport=httpx.MockTransport(handle))
    try:
        with pytest.raises(PreflightError, match="does not page them by after"):
            deployment.admin_adapter("t", "a")
    finally:
        deployment.close()
    assert len(calls) == 2
