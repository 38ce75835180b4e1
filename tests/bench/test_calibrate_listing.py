"""``sim calibrate``'s discovery pages through ``GET /admin/adapters`` (``after`` = the last
``tenant/name``) instead of reading only the first page."""

from __future__ import annotations

import httpx

from loraplex.bench.sim import calibrate_target

ROWS = [{"tenant": "t", "name": f"a{i}"} for i in range(5)]


def test_discovery_reads_every_page(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(calibrate_target, "MAX_PAGE", 2)
    calls: list[dict[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        calls.append(params)
        start = 0
        if "after" in params:
            start = [f"t/{r['name']}" for r in ROWS].index(params["after"]) + 1
        return httpx.Response(200, json=ROWS[start : start + int(params["limit"])])

    with httpx.Client(base_url="http://test", transport=httpx.MockTransport(handle)) as client:
        assert list(calibrate_target._listed_adapters(client)) == ROWS
    assert [c.get("after") for c in calls] == [None, "t/a1", "t/a3"]
