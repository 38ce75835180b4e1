"""The fleet router places by each replica's deployment rank, not by Ray's random id
(``routing.PlacementNames``): a replica replaced under the same rank (a new id) leaves every
revision's placement as it was. Driven without a cluster: fake replicas carry
``replica_id.unique_id`` and ``routing_stats`` as Ray's do (``test_routing``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from fleet_fakes import REPORT_NUMBERS, key, report, request

from loraplex.fleet.ray_router import LoraplexRequestRouter
from loraplex.fleet.report_cache import SEQ_KEY
from loraplex.fleet.routing import RANK_KEY, REPORT_KEY, TOPOLOGY_ASKS, PlacementNames, rank_of
from loraplex.router.placement import rank_name, rendezvous_order
from loraplex.router.reports import encode_report

REVISIONS = [key(f"adapter{i}") for i in range(24)]


def _replica(replica_id: str, rank: int | None, **kw: Any) -> SimpleNamespace:
    stats = {REPORT_KEY: encode_report(report(replica_id, **kw)), SEQ_KEY: next(REPORT_NUMBERS)}
    if rank is not None:
        stats[RANK_KEY] = rank
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=replica_id), routing_stats=stats)


def _router(**kwargs: Any) -> LoraplexRequestRouter:
    router = LoraplexRequestRouter.__new__(LoraplexRequestRouter)
    router.initialize_state(policy="affinity_until_saturated", seed=0, **kwargs)
    return router


def _first_choices(replicas: list[SimpleNamespace]) -> list[str]:
    """Where a fresh router sends each revision (resident nowhere, the fleet idle): the chosen
    replica's rank name, or its id where it reported no rank."""
    out = []
    for revision in REVISIONS:
        pending = SimpleNamespace(args=[request(adapter=revision)], kwargs={})
        chosen = asyncio.run(_router().choose_replicas(replicas, pending))[0][0]
        rank = rank_of(chosen.routing_stats)
        out.append(chosen.replica_id.unique_id if rank is None else rank_name(rank))
    return out


def test_a_replica_replaced_under_its_rank_keeps_every_revisions_placement() -> None:
    first = [_replica("tjn04uo6", 0), _replica("ka6u02iy", 1), _replica("av6j9phv", 2)]
    placed = _first_choices(first)
    assert len(set(placed)) == 3  # the revisions spread over every rank
    # Ray replaced rank 1 (a new random id), and redeployed all three under new ids
    replaced = [first[0], _replica("q8v1mmz0", 1), first[2]]
    redeployed = [_replica("p0x7c2aa", 2), _replica("zz41kq9e", 0), _replica("m3ddw0b5", 1)]
    assert _first_choices(replaced) == placed
    assert _first_choices(redeployed) == placed
    # each went to the first of its rendezvous order over the rank names (all idle)
    names = [rank_name(r) for r in range(3)]
    assert placed == [rendezvous_order(str(k), names)[0] for k in REVISIONS]


def test_without_ranks_the_ids_place_and_a_new_id_moves_revisions() -> None:
    """The behaviour ranks replace (a replica with no rank yet still routes, by its id)."""
    by_ids = _first_choices([_replica("tjn04uo6", None), _replica("ka6u02iy", None)])
    new_id = _first_choices([_replica("tjn04uo6", None), _replica("q8v1mmz0", None)])
    assert set(by_ids) == {"tjn04uo6", "ka6u02iy"}
    kept = "tjn04uo6"  # the replica not replaced: its share of the revisions moved all the same
    assert [i for i, r in enumerate(by_ids) if r == kept] != [
        i for i, r in enumerate(new_id) if r == kept
    ]


@pytest.mark.parametrize("bad", [-1, True, "1", 1.0, None])
def test_a_rank_that_is_not_one_is_no_rank(bad: Any) -> None:
    assert rank_of({RANK_KEY: bad}) is None
    assert rank_of({RANK_KEY: 3}) == 3


def test_a_rank_two_replicas_claim_names_neither_and_reports_are_renamed_once() -> None:
    names = PlacementNames()
    a, b, c = report("a"), report("b"), report("c")
    stats = {"a": {RANK_KEY: 1}, "b": {RANK_KEY: 1}, "c": {RANK_KEY: 0}}
    named = names.rename(stats, {"a": a, "b": b, "c": c, "d": None})
    assert sorted(named) == ["a", "b", "d", "rank-0"]  # the stopping one and its successor
    assert named["a"] is a and named["d"] is None
    renamed = named["rank-0"]
    assert renamed is not None and renamed.replica_id == "rank-0"
    assert renamed.residency == c.residency
    assert names.id_of("rank-0") == "c" and names.id_of("gone") == "gone"
    again = names.rename(stats, {"a": a, "b": b, "c": c})
    assert again["rank-0"] is renamed  # the same report: the same renamed one (views reused)
    moved = names.rename({"c": {RANK_KEY: 2}}, {"c": c})  # Ray moved c to another rank
    assert list(moved) == ["rank-2"] and names.id_of("rank-2") == "c"


def test_a_topology_ask_made_by_rank_reaches_that_ranks_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(TOPOLOGY_ASKS, "send", lambda rid, adapter: asked.append((rid, adapter)))
    router = _router(topology={"window_s": 30.0, "min_requests": 1})
    revision = str(REVISIONS[0])
    replicas = [
        _replica("tjn04uo6", 0, l0=[revision], num_queued=1),
        _replica("ka6u02iy", 1, l0=[revision]),
    ]
    pending = SimpleNamespace(args=[request(adapter=REVISIONS[0])], kwargs={})
    for _ in range(3):
        chosen = asyncio.run(router.choose_replicas(replicas, pending))[0][0]
        assert chosen.replica_id.unique_id == "ka6u02iy"
    assert asked == [("ka6u02iy", revision)]  # by its Ray id, not its rank name
