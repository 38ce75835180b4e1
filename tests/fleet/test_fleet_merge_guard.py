"""Behind a fleet ingress the admin guard and a release read every replica's merged revision
(docs/modes.md, "What a merge forbids"): a revision merged on any replica, a hung one included,
cannot be deprecated or left by its alias, and a release does not let it go; the guard's merge
holds reach every replica and are released exactly where they were taken."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fleet_fakes import (
    WAIT_S,
    CharTokenizer,
    FakeCalls,
    StreamOpener,
    entry,
    is_lost,
    key,
    load,
    polled_twice,
)
from fleet_fakes import started_link as _started_link

from loraplex.clock import ManualClock
from loraplex.engine.mode_report import ModeReport
from loraplex.engine.transport.messages import Dedicate, HoldMerges
from loraplex.errors import CapacityError, MergedRevisionError
from loraplex.fleet.cache import FleetCache, FleetMergeHolds
from loraplex.fleet.engine_client import FleetEngineClient
from loraplex.fleet.link import FleetLink
from loraplex.fleet.release_env import FleetReleaseEnv
from loraplex.release.traffic import ReleaseTraffic
from loraplex.server.merge_guard import guarded, left_by, refuse_if_merged
from loraplex.server.pin_owners import OwnedPins

MERGED = "acme/support@r1"  # merged on replica "b" only


def _merged_load(revision: str) -> Any:
    return replace(load(), mode=ModeReport("auto", revision))


@pytest.fixture(params=[True, False], ids=["healthy", "hung"])
def link(request: pytest.FixtureRequest) -> Iterator[FleetLink]:
    merged = entry("b", healthy=request.param, engine_load=_merged_load(MERGED))
    built = _started_link(FakeCalls(board=[entry("a"), merged]))
    yield built
    built.close()


def _client(link: FleetLink) -> FleetEngineClient:
    tokenizer: Any = CharTokenizer()
    return FleetEngineClient(StreamOpener([]), is_lost, link, tokenizer)


def test_the_fleet_load_names_a_revision_merged_on_any_replica(link: FleetLink) -> None:
    snapshot = _client(link).load_snapshot()
    assert snapshot.mode is None  # no engine of its own
    assert snapshot.merged_revisions == {MERGED}


def test_deprecating_or_leaving_a_revision_merged_on_one_replica_is_refused(
    link: FleetLink,
) -> None:
    client = _client(link)
    with pytest.raises(MergedRevisionError) as refused:
        refuse_if_merged(client, (MERGED,), "deprecated")
    assert MERGED in str(refused.value)
    left = left_by("acme", "support", ("r1",), ("r2",))
    with pytest.raises(MergedRevisionError), guarded(client, None, left, "left"):
        raise AssertionError("the alias change must not run")
    # moving onto it, and other revisions, are not refused
    with guarded(client, None, left_by("acme", "support", ("r2",), ("r1", "r2")), "left"):
        pass
    refuse_if_merged(client, ("acme/support@r2",), "deprecated")


def test_fleet_holds_answer_every_replicas_merge_and_release_where_they_held() -> None:
    merged_on = {"a": frozenset(), "b": frozenset({MERGED})}

    def reply(replica_id: str, command: Any) -> Any:
        assert isinstance(command, HoldMerges)
        return merged_on[replica_id] & command.refs if command.hold else frozenset()

    calls = FakeCalls(board=[entry("a"), entry("b")], reply=reply)
    link = _started_link(calls)
    try:
        holds = FleetMergeHolds(link)
        refs = frozenset({MERGED, "acme/support@r2"})
        assert holds.hold(refs) == {MERGED}
        calls.board = [entry("a"), entry("b"), entry("c")]  # a replica joins after the hold
        polled_twice(link)
        holds.release(refs)
        releases = [(rid, c) for rid, c in calls.calls if isinstance(c, HoldMerges) and not c.hold]
        assert sorted(rid for rid, _ in releases) == ["a", "b"]  # not "c": it held nothing
        assert all(c.refs == refs for _, c in releases)
    finally:
        link.close()


def test_a_fleet_release_sees_the_merge_of_one_replica(link: FleetLink) -> None:
    client = _client(link)
    traffic = ReleaseTraffic(ManualClock(), tuple)
    env = FleetReleaseEnv(OwnedPins(FleetCache(link)), client, traffic, link)
    assert env.is_merged(key(revision="r1"))
    assert not env.is_merged(key(revision="r2"))


def test_a_dedication_reaches_the_one_replica_by_its_revision_ref() -> None:
    calls = FakeCalls(board=[entry("a"), entry("b")])
    link = _started_link(calls)
    try:
        holds = FleetMergeHolds(link)
        holds.dedicate("b", f"{MERGED}#{'d' * 8}~{'b' * 8}~v1").result(WAIT_S)
        holds.dedicate("b", None).result(WAIT_S)
        assert calls.commands_to("b") == [Dedicate(MERGED), Dedicate(None)]
        assert calls.commands_to("a") == []
    finally:
        link.close()


def test_a_replica_that_cannot_hold_fails_the_hold_and_the_others_are_released() -> None:
    def reply(replica_id: str, command: Any) -> Any:
        if replica_id == "b" and command.hold:
            raise RuntimeError("replica b is stuck")
        return frozenset()

    calls = FakeCalls(board=[entry("a"), entry("b")], reply=reply)
    link = _started_link(calls)
    try:
        refs = frozenset({MERGED})
        with pytest.raises(CapacityError, match="replica b could not hold"):
            FleetMergeHolds(link).hold(refs)
        released = sorted(rid for rid, c in calls.calls if isinstance(c, HoldMerges) and not c.hold)
        assert released == ["a", "b"]
    finally:
        link.close()
