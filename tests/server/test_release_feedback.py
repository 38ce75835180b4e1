"""POST /v1/feedback (tenant isolation, once per request, validation) and the per-revision
release metrics on /metrics, on the fake engine."""

from __future__ import annotations

from typing import Any

from conftest import Rig
from prometheus_client.parser import text_string_to_metric_families

from loraplex.errors import GenerationError
from loraplex.release.traffic import BASELINE, CANDIDATE, TrackedRevision
from loraplex.server.deps import ServerDeps

CAND = "acme/support@r2"
BASE = "acme/support@r1"


def _deps(rig: Rig) -> ServerDeps:
    deps: ServerDeps = rig.client.app.state.deps  # type: ignore[attr-defined]
    return deps


def _track(rig: Rig) -> None:
    _deps(rig).releases.set_tracked(
        [
            TrackedRevision(CAND, "rel-1", CANDIDATE, "canary"),
            TrackedRevision(BASE, "rel-1", BASELINE, "canary"),
        ]
    )


def _complete(rig: Rig, tenant: str, model: str, request_id: str | None = None) -> Any:
    body = {"model": model, "prompt": "hi", "max_tokens": 4}
    headers = rig.headers(tenant)
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    response = rig.client.post("/v1/completions", json=body, headers=headers)
    return response


def _rate(rig: Rig, tenant: str, request_id: str, rating: str = "good") -> Any:
    body = {"request_id": request_id, "rating": rating}
    return rig.client.post("/v1/feedback", json=body, headers=rig.headers(tenant))


def test_owner_rates_once_and_it_counts_in_the_window(rig: Rig) -> None:
    _track(rig)
    response = _complete(rig, "acme", "support@r2")
    assert response.status_code == 200
    request_id = response.json()["id"]
    rated = _rate(rig, "acme", request_id, "bad")
    assert rated.status_code == 200
    assert rated.json() == {
        "request_id": request_id,
        "rating": "bad",
        "revision": CAND,
        "counted": True,
    }
    window = _deps(rig).releases.window(CAND, 0.0)
    assert (window.requests, window.good, window.bad) == (1, 0, 1)
    again = _rate(rig, "acme", request_id, "good")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_rated"
    assert _deps(rig).releases.window(CAND, 0.0).good == 0


def test_another_tenant_gets_the_unknown_id_404(rig: Rig) -> None:
    request_id = _complete(rig, "acme", "support").json()["id"]
    foreign = _rate(rig, "globex", request_id)
    missing = _rate(rig, "globex", request_id[:-1] + ("0" if request_id[-1] != "0" else "1"))
    assert foreign.status_code == missing.status_code == 404
    other_id = missing.json()["error"]["message"].split("'")[1]
    unknown_body = missing.json()["error"]
    unknown_body["message"] = unknown_body["message"].replace(other_id, request_id)
    assert foreign.json()["error"] == unknown_body
    # The owner can still rate it: the foreign attempt changed nothing.
    assert _rate(rig, "acme", request_id).status_code == 200


def test_two_tenants_with_one_request_id_each_rate_their_own(rig: Rig) -> None:
    _track(rig)
    assert _complete(rig, "acme", "support@r2", "trace-0001").json()["id"] == "trace-0001"
    assert _complete(rig, "globex", "search", "trace-0001").status_code == 200
    acme = _rate(rig, "acme", "trace-0001", "bad")
    globex = _rate(rig, "globex", "trace-0001", "good")
    assert (acme.status_code, globex.status_code) == (200, 200)
    assert (acme.json()["revision"], acme.json()["counted"]) == (CAND, True)
    assert globex.json()["revision"].startswith("globex/search@")
    window = _deps(rig).releases.window(CAND, 0.0)
    assert (window.good, window.bad) == (0, 1)  # globex's rating did not land on acme's


def test_untracked_revision_is_accepted_but_not_counted(rig: Rig) -> None:
    request_id = _complete(rig, "acme", "legal").json()["id"]
    rated = _rate(rig, "acme", request_id)
    assert rated.status_code == 200
    assert rated.json()["counted"] is False
    assert rated.json()["revision"].startswith("acme/legal@")


def test_feedback_validation(rig: Rig) -> None:
    headers = rig.headers("acme")
    cases = [
        ({"request_id": "cmpl-x", "rating": "meh"}, "rating"),
        ({"request_id": "cmpl-x", "rating": "good", "comment": "hi"}, "comment"),
        ({"request_id": "", "rating": "good"}, "request_id"),
        ({"rating": "good"}, "request_id"),
    ]
    for body, field in cases:
        response = rig.client.post("/v1/feedback", json=body, headers=headers)
        assert response.status_code == 400, body
        assert field in str(response.json()["error"]["param"]), body
    unauthenticated = rig.client.post("/v1/feedback", json={"request_id": "x", "rating": "good"})
    assert unauthenticated.status_code == 401


def _samples(rig: Rig) -> dict[str, list[Any]]:
    text = rig.client.get("/metrics", headers=rig.admin).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_release_metrics_are_per_revision_and_bounded(rig: Rig) -> None:
    assert _samples(rig).get("loraplex_release_requests", []) == []
    _track(rig)
    rig.engine.errors[CAND] = GenerationError("x", "non-finite logits")
    assert _complete(rig, "acme", "support@r2").status_code == 422
    assert _complete(rig, "acme", "support@r1").status_code == 200
    assert _complete(rig, "acme", "legal").status_code == 200  # not under release
    samples = _samples(rig)
    counts = {
        (s.labels["revision"], s.labels["role"], s.labels["outcome"]): s.value
        for s in samples["loraplex_release_requests"]
        if s.name.endswith("_total")
    }
    assert counts == {
        ("r2", CANDIDATE, "ok"): 0,
        ("r2", CANDIDATE, "error"): 1,
        ("r1", BASELINE, "ok"): 1,
        ("r1", BASELINE, "error"): 0,
    }
    assert {s.labels["adapter"] for s in samples["loraplex_release_requests"]} == {"acme/support"}
    (state,) = samples["loraplex_release_state"]
    assert (state.labels["revision"], state.labels["state"], state.value) == ("r2", "canary", 1)
    _deps(rig).releases.set_tracked([])  # the release ended: its series go
    assert _samples(rig).get("loraplex_release_requests", []) == []
