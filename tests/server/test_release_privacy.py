"""A caller of another tenant's public adapter learns the revision that answered it (truthful
answers) but not that the adapter is under release: ``POST /v1/feedback`` answers such a caller
in one shape whether or not its rating counted in a release window (``counted`` null), and no
header of an answer tells a candidate from a stable revision beyond the revision itself. The
owner still sees whether its ratings counted. On the fake engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Rig

from loraplex.registry import Visibility
from loraplex.release.traffic import BASELINE, CANDIDATE, TrackedRevision
from loraplex.server.deps import ServerDeps

OWNER, NAME = "globex", "search"
ALIAS = f"{OWNER}/{NAME}"
# headers every answer has, whose values differ per answer whatever the revision
PER_ANSWER = {"content-length", "date", "x-request-id"}


@pytest.fixture
def shared(rig: Rig) -> Iterator[Rig]:
    """``globex/search`` public for one test (the registry is shared by the session)."""
    registry = rig.served.registry
    registry.set_visibility(OWNER, NAME, Visibility.PUBLIC, "test")
    try:
        yield rig
    finally:
        registry.set_visibility(OWNER, NAME, Visibility.PRIVATE, "test")


def _deps(rig: Rig) -> ServerDeps:
    deps: ServerDeps = rig.client.app.state.deps  # type: ignore[attr-defined]
    return deps


def _served(rig: Rig) -> str:
    """The revision ``globex/search`` answers with (``tenant/name@revision``)."""
    return rig.served.registry.resolve(OWNER, ALIAS).ref


def _release(rig: Rig, role: str | None) -> None:
    """``globex/search``'s serving revision under release as ``role`` (None: no release)."""
    ref = _served(rig)
    other = ref.rpartition("@")[0] + "@r0"
    tracked = [] if role is None else [
        TrackedRevision(ref, "rel-1", role, "canary"),
        TrackedRevision(other, "rel-1", BASELINE if role == CANDIDATE else CANDIDATE, "canary"),
    ]  # fmt: skip
    _deps(rig).releases.set_tracked(tracked)


def _complete(rig: Rig, tenant: str, model: str, **body: Any) -> Any:
    payload = {"model": model, "prompt": "hi", "max_tokens": 4, **body}
    return rig.client.post("/v1/completions", json=payload, headers=rig.headers(tenant))


def _rate(rig: Rig, tenant: str, request_id: str) -> Any:
    body = {"request_id": request_id, "rating": "good"}
    response = rig.client.post("/v1/feedback", json=body, headers=rig.headers(tenant))
    assert response.status_code == 200, response.text
    return response.json()


def test_feedback_does_not_tell_a_non_owner_that_a_release_exists(shared: Rig) -> None:
    cand = _served(shared)
    before = _rate(shared, "acme", _complete(shared, "acme", ALIAS).json()["id"])
    _release(shared, CANDIDATE)
    during = _rate(shared, "acme", _complete(shared, "acme", ALIAS).json()["id"])
    assert before["revision"] == during["revision"] == cand  # the revision stays truthful
    assert before == {**during, "request_id": before["request_id"]}
    assert during["counted"] is None
    # the rating still counts for the owner's release (attack5 judges it without the caller
    # pushing most), and the owner is told so
    assert _deps(shared).releases.window(cand, 0.0).good == 1
    mine = _rate(shared, OWNER, _complete(shared, OWNER, NAME).json()["id"])
    assert mine["counted"] is True
    assert _deps(shared).releases.window(cand, 0.0).good == 2
    _release(shared, None)
    assert _rate(shared, OWNER, _complete(shared, OWNER, NAME).json()["id"])["counted"] is False


def test_no_header_tells_a_candidate_from_a_stable_revision(shared: Rig) -> None:
    """The same revision answering as a release's candidate, as its stable revision and with no
    release: the same headers (the revision's among them), the same ``loraplex`` field."""
    for stream in (False, True):
        seen = []
        for role in (CANDIDATE, BASELINE, None):
            _release(shared, role)
            answer = _complete(shared, "acme", ALIAS, stream=stream)
            assert answer.status_code == 200
            headers = {k: v for k, v in answer.headers.items() if k not in PER_ANSWER}
            field = None if stream else answer.json()["loraplex"]
            seen.append((headers, field))
        assert seen[0] == seen[1] == seen[2], stream
        assert seen[0][0]["x-loraplex-revision"] == _served(shared)
