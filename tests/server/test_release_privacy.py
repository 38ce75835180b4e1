"""A caller of another tenant's public adapter learns the revision that answered it (truthful
answers) but not that the adapter is under release: ``POST /v1/feedback`` answers such a caller
in one shape whether or not its rating counted in a release window (``counted`` null), no
header of an answer tells a candidate from a stable revision beyond the revision itself, and a
canary candidate it was served pins as the stable revision does (a 404 there told it the
revision was not the alias's); outside the canary the candidate's pin is the unknown model's
404, byte for byte; and one ``user`` stays on one revision of a weighted alias as it does on one
side of a canary (per request, the alias's revisions alternated and a canary's did not). The
owner still sees whether its ratings counted. On the fake engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from conftest import Rig

from loraplex.registry import AliasTarget, Visibility
from loraplex.release.model import ReleasePlan, ReleaseState
from loraplex.release.store import ReleaseStore
from loraplex.release.traffic import BASELINE, CANDIDATE, TrackedRevision
from loraplex.server.deps import ServerDeps

OWNER, NAME = "globex", "search"
ALIAS = f"{OWNER}/{NAME}"
# headers every answer has, whose values differ per answer whatever the revision
PER_ANSWER = {"content-length", "date", "x-request-id"}
T = TypeVar("T")


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


def _pin_answers(rig: Rig, model: str) -> list[tuple[int, dict[str, str], bytes]]:
    """``model`` as acme sees it: a completion and its model card (status, headers, body)."""
    answers = [
        _complete(rig, "acme", model),
        rig.client.get(f"/v1/models/{model}", headers=rig.headers("acme")),
    ]
    return [
        (a.status_code, {k: v for k, v in a.headers.items() if k not in PER_ANSWER}, a.content)
        for a in answers
    ]


def _as_unknown(rig: Rig, label: str, unknown: str) -> list[tuple[int, dict[str, str], bytes]]:
    """The answers to a pin of ``unknown`` (a label no revision has) with ``label`` written in
    its place: what a pin of ``label`` must read as when the caller may not see it."""
    swap = f"@{unknown}".encode(), f"@{label}".encode()
    return [(s, h, b.replace(*swap)) for s, h, b in _pin_answers(rig, f"{ALIAS}@{unknown}")]


def test_a_canary_candidate_pins_as_a_served_revision_and_else_as_an_unknown_one(
    shared: Rig,
) -> None:
    registry = shared.served.registry
    stable = _served(shared).rpartition("@")[2]
    candidate = "r2" if stable != "r2" else "r3"
    store = ReleaseStore(registry)
    release = store.start_release(OWNER, NAME, candidate, ReleasePlan(ladder=(1.0,)), actor="ops")
    try:
        for to in (ReleaseState.PREWARMING, ReleaseState.PROBING):
            release = store.transition(release, to, actor="c", now=registry.now())
        # not yet served to anyone else: its pin is any unknown label's 404
        assert _pin_answers(shared, f"{ALIAS}@{candidate}") == _as_unknown(shared, candidate, "r9")
        store.transition(release, ReleaseState.CANARY, actor="c", now=registry.now(), step=0)
        served = _complete(shared, "acme", ALIAS)
        assert served.headers["x-loraplex-revision"] == f"{ALIAS}@{candidate}"
        pinned = _pin_answers(shared, f"{ALIAS}@{candidate}")
        stable_pin = _pin_answers(shared, f"{ALIAS}@{stable}")
        assert [a[0] for a in pinned] == [a[0] for a in stable_pin] == [200, 200]
        assert [sorted(a[1]) for a in pinned] == [sorted(a[1]) for a in stable_pin]
        assert pinned[0][1]["x-loraplex-revision"] == f"{ALIAS}@{candidate}"
    finally:
        store.rollback(OWNER, NAME, actor="ops")
    # rolled back, the candidate is no longer served: the unknown model's answer again
    assert _pin_answers(shared, f"{ALIAS}@{candidate}") == _as_unknown(shared, candidate, "r9")


def _revisions_by_user(rig: Rig, users: range, num_requests: int) -> dict[int, set[str]]:
    seen: dict[int, set[str]] = {}
    for user in users:
        for _ in range(num_requests):
            answer = _complete(rig, "acme", ALIAS, user=f"u{user}")
            seen.setdefault(user, set()).add(answer.headers["x-loraplex-revision"])
    return seen


def _in_canary(rig: Rig, candidate: str, seen: Callable[[], T]) -> T:
    """``seen()`` while ``globex/search``'s release of ``candidate`` is in canary at 1/2."""
    registry = rig.served.registry
    store = ReleaseStore(registry)
    release = store.start_release(OWNER, NAME, candidate, ReleasePlan(ladder=(0.5,)), actor="ops")
    try:
        for to in (ReleaseState.PREWARMING, ReleaseState.PROBING):
            release = store.transition(release, to, actor="c", now=registry.now())
        store.transition(release, ReleaseState.CANARY, actor="c", now=registry.now(), step=0)
        return seen()
    finally:
        store.rollback(OWNER, NAME, actor="ops")


def test_one_user_stays_on_one_revision_of_a_weighted_alias_as_of_a_canary(shared: Rig) -> None:
    registry = shared.served.registry
    stable = _served(shared).rpartition("@")[2]
    other = "r2" if stable != "r2" else "r3"
    registry.set_alias(OWNER, NAME, (AliasTarget(stable, 1), AliasTarget(other, 1)), "test")
    try:
        weighted = _revisions_by_user(shared, range(12), 4)
    finally:
        registry.set_alias(OWNER, NAME, (AliasTarget(stable, 1),), "test")
    assert all(len(revisions) == 1 for revisions in weighted.values()), weighted
    assert set().union(*weighted.values()) == {f"{ALIAS}@{stable}", f"{ALIAS}@{other}"}
    canary = _in_canary(shared, other, lambda: _revisions_by_user(shared, range(12), 4))
    assert all(len(revisions) == 1 for revisions in canary.values()), canary


def test_a_canary_splits_users_as_a_weighted_alias_would(shared: Rig) -> None:
    """Which of a non-owner's ``user`` values draw the candidate of a canary at share 1/2 is
    exactly which would draw it from an alias weighting candidate and stable 1:1. Before, the
    alias's draw was sha256 of the adapter's name and the user, which any caller can compute, and
    a canary's of the (secret) release id and the user: a non-owner whose users' revisions did not
    follow the computable draw knew a release was under way."""
    registry = shared.served.registry
    stable = _served(shared).rpartition("@")[2]
    other = "r2" if stable != "r2" else "r3"
    users = range(24)
    registry.set_alias(OWNER, NAME, (AliasTarget(other, 1), AliasTarget(stable, 1)), "test")
    try:
        weighted = _revisions_by_user(shared, users, 1)
    finally:
        registry.set_alias(OWNER, NAME, (AliasTarget(stable, 1),), "test")
    canary = _in_canary(shared, other, lambda: _revisions_by_user(shared, users, 1))
    assert set().union(*weighted.values()) == {f"{ALIAS}@{stable}", f"{ALIAS}@{other}"}
    assert canary == weighted
