"""``FleetReleaseEnv``: a probe runs on every healthy replica and passes only when all answer the
same; prewarm goes through ``FleetCache`` to every replica."""

from __future__ import annotations

from typing import Any

import pytest
from fleet_fakes import (
    WAIT_S,
    CharTokenizer,
    FakeCalls,
    FakeStream,
    entry,
    is_lost,
    key,
    polled_twice,
)

from loraplex.clock import ManualClock
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.transport.messages import Pin
from loraplex.engine.transport.packed_errors import pack_error
from loraplex.errors import CorruptArtifactError, EngineUnavailableError
from loraplex.fleet.cache import FleetCache
from loraplex.fleet.engine_client import FleetEngineClient
from loraplex.fleet.link import FleetLink
from loraplex.fleet.release_env import FleetReleaseEnv, ReplicasDisagreeError
from loraplex.fleet.wire import Accepted, Failed, RouteHint
from loraplex.release.traffic import ReleaseTraffic
from loraplex.residency.ledger import Tier
from loraplex.serve.release_env import PROBE_PREFIX
from loraplex.server.pin_owners import OwnedPins


class ProbeAnswers:
    """``open_stream`` for probes: each replica answers its scripted items; records requests."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = answers
        self.opened: list[tuple[str, EngineRequest]] = []

    def __call__(self, request: EngineRequest, hint: RouteHint) -> FakeStream:
        assert hint.target is not None, "a probe must name its replica"
        self.opened.append((hint.target, request))
        return FakeStream([Accepted(hint.target), *self.answers[hint.target]])


def _text(text: str) -> list[TokenDelta]:
    return [TokenDelta((9,), part, None, 3, i + 1) for i, part in enumerate(text.split("|"))]


@pytest.fixture
def calls() -> FakeCalls:
    """conftest's board and a replica out of rotation (``link``: conftest's)."""
    return FakeCalls(board=[entry("a"), entry("b"), entry("sick", healthy=False)])


def _env(link: FleetLink, answers: ProbeAnswers) -> FleetReleaseEnv:
    tokenizer: Any = CharTokenizer()
    client = FleetEngineClient(answers, is_lost, link, tokenizer)
    traffic = ReleaseTraffic(ManualClock(), tuple)
    return FleetReleaseEnv(OwnedPins(FleetCache(link)), client, traffic, link)


def test_equal_answers_pass_with_the_text(link: FleetLink) -> None:
    answers = ProbeAnswers({"a": _text(" yes| sir"), "b": _text(" yes| sir")})
    env = _env(link, answers)
    try:
        assert env.probe(key(), "acme", "Hi", 2).result(WAIT_S) == " yes sir"
    finally:
        env.close()
    assert sorted(target for target, _ in answers.opened) == ["a", "b"]
    requests = [r for _, r in answers.opened]
    assert len({r.request_id for r in requests}) == 2  # each replica its own request
    for r in requests:
        assert r.request_id.startswith(f"{PROBE_PREFIX}-")
        assert (r.tenant, r.adapter_key, r.prompt_token_ids) == ("acme", key(), (1, 75, 108))
        assert (r.params.temperature, r.params.max_tokens) == (0.0, 2)
        assert r.probe  # not traffic: ``auto`` does not merge on it (attack27)


def test_different_answers_fail_naming_the_replicas(link: FleetLink) -> None:
    env = _env(link, ProbeAnswers({"a": _text(" yes"), "b": _text(" no")}))
    try:
        with pytest.raises(ReplicasDisagreeError) as raised:
            env.probe(key(), "acme", "Hi", 2).result(WAIT_S)
    finally:
        env.close()
    message = str(raised.value)
    assert key().ref in message
    assert "'a': ' yes'" in message and "'b': ' no'" in message


def test_a_replica_failing_the_probe_fails_it(link: FleetLink) -> None:
    failed = Failed(pack_error(CorruptArtifactError("acme/support@r1 did not load")))
    env = _env(link, ProbeAnswers({"a": _text(" yes"), "b": [failed]}))
    try:
        with pytest.raises(CorruptArtifactError, match="did not load"):
            env.probe(key(), "acme", "Hi", 2).result(WAIT_S)
    finally:
        env.close()


def test_no_replica_in_rotation_fails_the_probe(calls: FakeCalls, link: FleetLink) -> None:
    calls.board = [entry("sick", healthy=False)]
    polled_twice(link)
    answers = ProbeAnswers({})
    env = _env(link, answers)
    try:
        with pytest.raises(EngineUnavailableError, match="no engine replica is in rotation"):
            env.probe(key(), "acme", "Hi", 2).result(WAIT_S)
    finally:
        env.close()
    assert answers.opened == []


def test_prewarm_pins_on_every_healthy_replica(calls: FakeCalls, link: FleetLink) -> None:
    env = _env(link, ProbeAnswers({}))
    # The cache has seen the board: a replica it meets after the pin gets the standing pin
    # replayed (a second, idempotent Pin; the test failed that way on a slow machine).
    polled_twice(link)
    try:
        env.prewarm(key(), gpu=True).result(WAIT_S)
    finally:
        env.close()
    for tier in (Tier.L1, Tier.L0):
        assert sorted(rid for rid, c in calls.calls if c == Pin(key(), tier)) == ["a", "b"]
