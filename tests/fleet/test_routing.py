"""The request router's Ray-free parts (report stamps, the handle call's ``RouteRequest``,
sessions, the decision log) and ``LoraplexRequestRouter.choose_replicas`` driven without a
cluster: fake replicas carry ``replica_id.unique_id`` and ``routing_stats`` as Ray's do."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from fleet_fakes import REPORT_NUMBERS, key, report, request

from loraplex.clock import ManualClock
from loraplex.engine.transport.messages import Snapshot
from loraplex.fleet.ray_router import LoraplexRequestRouter
from loraplex.fleet.report_cache import SEQ_KEY
from loraplex.fleet.routing import (
    REPORT_KEY,
    ROUTING_LOG,
    TOPOLOGY_ASKS,
    UP_KEY,
    FirstTries,
    ReportStamps,
    RoutingLog,
    Unadmitted,
    in_rotation,
    is_stale,
    route_request_of,
    session_of,
)
from loraplex.fleet.wire import RouteHint
from loraplex.router.decision import RouteRequest
from loraplex.router.reports import ReplicaReport, encode_report


def _stats(reported: ReplicaReport) -> dict[str, Any]:
    """Routing stats as a replica hands them to Ray: the encoded report and a new number."""
    return {REPORT_KEY: encode_report(reported), SEQ_KEY: next(REPORT_NUMBERS)}


# --- ReportStamps ---------------------------------------------------------------------------


def test_a_report_is_stamped_when_made_on_the_routers_clock_and_keeps_that_stamp() -> None:
    stamps = ReportStamps()
    first = stamps.report_of("a", _stats(report("a", at_s=500.0, l0=["k"])), now_s=10.0)
    assert first is not None and first.at_s == 10.0 and "k" in first.residency.l0
    again = stamps.report_of("a", _stats(report("a", at_s=500.0, l0=["k"])), now_s=12.0)
    assert again is not None and again.at_s == 10.0  # the same report: its stamp
    # made 1 s after the first on a's clock, first seen 3 s after it (no routing meanwhile):
    # stamped when made, so a frozen replica's last report does not look new after a lull
    newer = stamps.report_of("a", _stats(report("a", at_s=501.0)), now_s=13.0)
    assert newer is not None and newer.at_s == 11.0 and not newer.residency.l0
    # a quicker delivery than any before lowers the offset; no stamp is later than now
    quick = stamps.report_of("a", _stats(report("a", at_s=505.0)), now_s=14.5)
    assert quick is not None and quick.at_s == 14.5
    later = stamps.report_of("a", _stats(report("a", at_s=506.0)), now_s=20.0)
    assert later is not None and later.at_s == 15.5


def test_no_report_yet_is_none_and_a_missing_one_keeps_the_previous() -> None:
    stamps = ReportStamps()
    assert stamps.report_of("a", {}, now_s=1.0) is None
    stamps.report_of("a", _stats(report("a", at_s=5.0)), now_s=2.0)
    kept = stamps.report_of("a", {}, now_s=3.0)
    assert kept is not None and kept.at_s == 2.0


def test_malformed_and_mismatched_reports_are_counted_and_leave_the_previous() -> None:
    stamps = ReportStamps()
    before = ROUTING_LOG.malformed_reports
    bad = encode_report(report("a", at_s=6.0))
    bad["load"]["kv_usage"] = 2.0
    bad_stats = {REPORT_KEY: bad, SEQ_KEY: next(REPORT_NUMBERS)}
    assert stamps.report_of("a", bad_stats, now_s=1.0) is None
    assert ROUTING_LOG.malformed_reports == before + 1
    assert stamps.report_of("a", bad_stats, now_s=1.5) is None  # the same report: counted once
    assert ROUTING_LOG.malformed_reports == before + 1
    stamps.report_of("a", _stats(report("a", at_s=5.0, l0=["k"])), now_s=2.0)
    kept = stamps.report_of("a", {REPORT_KEY: bad, SEQ_KEY: next(REPORT_NUMBERS)}, now_s=3.0)
    assert kept is not None and kept.at_s == 2.0 and "k" in kept.residency.l0
    other = stamps.report_of("a", _stats(report("b", at_s=9.0)), now_s=4.0)
    assert other is not None and other.replica_id == "a" and other.at_s == 2.0
    garbage = {REPORT_KEY: "not a report", SEQ_KEY: next(REPORT_NUMBERS)}
    assert stamps.report_of("a", garbage, now_s=5.0) == kept
    unnumbered = {REPORT_KEY: encode_report(report("a", at_s=9.0))}
    assert stamps.report_of("a", unnumbered, now_s=6.0) == kept
    assert stamps.report_of("a", {**unnumbered, SEQ_KEY: True}, now_s=6.0) == kept
    assert stamps.report_of("a", {**unnumbered, SEQ_KEY: -1}, now_s=6.0) == kept
    assert ROUTING_LOG.malformed_reports == before + 7


def test_a_report_is_decoded_once_per_number_and_a_new_number_replaces_it() -> None:
    """A replica's stats are decoded once per report number (never per request); a new number
    is a new report even at the same ``at_s``: the old one never routes again."""
    stamps = ReportStamps()
    stats = _stats(report("a", at_s=5.0, l0=["k"]))
    first = stamps.report_of("a", stats, now_s=1.0)
    assert first is not None and "k" in first.residency.l0
    # the same number: not decoded again (a garbage payload under it is never looked at)
    assert stamps.report_of("a", {**stats, REPORT_KEY: "not decoded"}, now_s=1.5) is first
    # a new report at the same replica clock reading: decoded, and it is the one that counts
    moved = stamps.report_of("a", _stats(report("a", at_s=5.0, l1=["k"])), now_s=2.0)
    assert moved is not None and moved is not first
    assert "k" not in moved.residency.l0 and "k" in moved.residency.l1
    assert moved.at_s == first.at_s == 1.0  # the same moment on the replica: the same stamp


def test_forget_except_drops_the_others_stamps() -> None:
    stamps = ReportStamps()
    stamps.report_of("a", _stats(report("a", at_s=5.0)), now_s=1.0)
    stamps.report_of("b", _stats(report("b", at_s=5.0)), now_s=1.0)
    stamps.forget_except({"a"})
    assert stamps.report_of("b", {}, now_s=2.0) is None
    restamped = stamps.report_of("b", _stats(report("b", at_s=5.0)), now_s=3.0)
    assert restamped is not None and restamped.at_s == 3.0  # seen anew
    kept = stamps.report_of("a", _stats(report("a", at_s=5.0)), now_s=3.0)
    assert kept is not None and kept.at_s == 1.0


# --- the handle call's RouteRequest, sessions, the log --------------------------------------


def test_a_generate_call_routes_by_its_request() -> None:
    revision = key()
    call = request(adapter=revision, session="u1", num_tokens=5)
    assert route_request_of([call]) == RouteRequest(str(revision), "acme/u1", 5, tenant="acme")
    base = RouteRequest(None, None, 2, tenant="acme")
    assert route_request_of((request(num_tokens=2),)) == base


def test_other_calls_route_as_an_empty_base_model_request() -> None:
    empty = RouteRequest(None, None, 0)
    assert route_request_of([]) == empty
    assert route_request_of([Snapshot()]) == empty
    assert route_request_of(["generate"]) == empty


def test_sessions_are_scoped_to_their_tenant() -> None:
    assert session_of(request(session=None)) is None
    acme = session_of(request(tenant="acme", session="alice"))
    globex = session_of(request(tenant="globex", session="alice"))
    assert acme == "acme/alice" and globex == "globex/alice"


def test_a_tenant_flooding_fresh_sessions_pushes_out_only_its_own() -> None:
    """A hostile tenant sending a fresh X-Session-Id per request past ``max_sessions``: each
    tenant's sessions reach the router through ``choose_replicas``, and globex's conversation
    keeps its replica. NOTE: one LRU order over every tenant dropped globex's session after
    ``max_sessions`` of acme's, and its next request was a fresh power-of-two choice."""
    # NOTE: no saturation: the reports never change here, so every routed request stays
    # pending load (in a fleet reports come every second and the flood is spread over time)
    caps = {"max_queued": 1000, "max_ongoing": 1000}
    router = _router(seed=0, router_config={"max_sessions": 8, **caps})
    replicas = [_replica(i, _stats(report(i))) for i in ("a", "b", "c", "d")]
    victim = _pending(request(tenant="globex", session="conversation"))
    served_on = _choose(router, replicas, victim)[0]
    before = ROUTING_LOG.counts().get("session", 0)
    for i in range(64):
        _choose(router, replicas, _pending(request(tenant="acme", session=f"flood-{i}")))
    for _ in range(4):
        assert _choose(router, replicas, victim)[0] == served_on
    assert ROUTING_LOG.counts().get("session", 0) == before + 4
    # acme's own newest sessions stick: the table is bounded, not emptied of the flooder
    recent = _pending(request(tenant="acme", session="flood-63"))
    before = ROUTING_LOG.counts()["session"]
    _choose(router, replicas, recent)
    assert ROUTING_LOG.counts()["session"] == before + 1


def test_routing_log_counts_reasons_and_hands_out_copies() -> None:
    log = RoutingLog()
    threads = [
        threading.Thread(target=lambda: [log.record("gpu_hit") for _ in range(500)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.record("pow2")
    counts = log.counts()
    assert counts == {"gpu_hit": 2000, "pow2": 1}
    counts["pow2"] = 99
    assert log.counts()["pow2"] == 1


# --- LoraplexRequestRouter.choose_replicas without a cluster ---------------------------------


def _router(**kwargs: Any) -> LoraplexRequestRouter:
    router = LoraplexRequestRouter.__new__(LoraplexRequestRouter)
    router.initialize_state(**kwargs)
    return router


def _replica(replica_id: str, stats: dict[str, Any] | None = None) -> SimpleNamespace:
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=replica_id), routing_stats=stats)


def _pending(*args: Any, **kwargs: Any) -> SimpleNamespace:
    return SimpleNamespace(args=list(args), kwargs=kwargs)


def _choose(router: LoraplexRequestRouter, replicas: list[Any], pending: Any) -> list[str]:
    ranked = asyncio.run(router.choose_replicas(replicas, pending))
    assert all(len(group) == 1 for group in ranked)
    return [group[0].replica_id.unique_id for group in ranked]


def test_a_target_hint_returns_only_that_replica() -> None:
    router = _router(seed=0)
    replicas = [_replica("a"), _replica("b"), _replica("c")]
    assert _choose(router, replicas, _pending(Snapshot(), hint=RouteHint(target="b"))) == ["b"]
    # A target that left: every replica is offered, and the one that takes it refuses the call
    # at once (deployments.EngineDeploymentImpl._misrouted), never Ray retrying forever.
    absent = asyncio.run(
        router.choose_replicas(replicas, _pending(Snapshot(), hint=RouteHint(target="z")))
    )
    assert [[r.replica_id.unique_id for r in group] for group in absent] == [["a", "b", "c"]]
    assert _choose(router, [], _pending(request())) == []


def test_avoided_replicas_are_left_out_unless_none_would_remain() -> None:
    router = _router(seed=0)
    replicas = [_replica("a"), _replica("b"), _replica("c")]
    avoid_a = _pending(request(), hint=RouteHint(avoid=frozenset({"a"})))
    assert sorted(_choose(router, replicas, avoid_a)) == ["b", "c"]
    avoid_all = _pending(request(), hint=RouteHint(avoid=frozenset({"a", "b", "c"})))
    assert sorted(_choose(router, replicas, avoid_all)) == ["a", "b", "c"]
    assert sorted(_choose(router, replicas, _pending(request()))) == ["a", "b", "c"]


def test_a_replica_whose_engine_is_not_up_leaves_the_rotation_unless_all_are_out() -> None:
    router = _router(seed=0)
    hung = {**_stats(report("b", l0=[str(key())])), UP_KEY: False}
    replicas = [_replica("a", {UP_KEY: True}), _replica("b", hung), _replica("c")]
    for _ in range(5):  # b holds the revision in a GPU slot, and is never chosen
        assert sorted(_choose(router, replicas, _pending(request(adapter=key())))) == ["a", "c"]
    all_out = [_replica("a", {UP_KEY: False}), _replica("b", hung)]
    assert sorted(_choose(router, all_out, _pending(request()))) == ["a", "b"]  # each refuses


def test_a_replaced_report_never_routes_again() -> None:
    """The router decodes each report once (by its number); a replica's next report replaces
    its decoded one at once: a revision the replica no longer holds draws no more traffic to
    it (its own decisions before that report no longer count either)."""
    clock = ManualClock(10.0)
    router = _router(policy="affinity", seed=0, clock=clock)
    revision = str(key())
    a_holds = _stats(report("a", at_s=3.0, l0=[revision]))
    b_stats = _stats(report("b", at_s=3.0, l1=[revision]))
    replicas = [_replica("a", a_holds), _replica("b", b_stats)]
    assert _choose(router, replicas, _pending(request(adapter=key())))[0] == "a"
    assert _choose(router, replicas, _pending(request(adapter=key())))[0] == "a"  # cached
    clock.advance(1.0)
    a_evicted = _stats(report("a", at_s=4.0))  # a's next report: the revision is gone from a
    replicas = [_replica("a", a_evicted), _replica("b", b_stats)]
    for _ in range(3):
        assert _choose(router, replicas, _pending(request(adapter=key())))[0] == "b"


def test_a_gpu_resident_revision_wins_and_only_generate_calls_are_counted() -> None:
    router = _router(policy="affinity_until_saturated", seed=0)
    revision = str(key())
    replicas = [
        _replica("a", _stats(report("a"))),
        _replica("b", _stats(report("b", l0=[revision]))),
        _replica("c", _stats(report("c"))),
    ]
    before = ROUTING_LOG.counts()
    ranked = _choose(router, replicas, _pending(request(adapter=key())))
    assert ranked[0] == "b" and sorted(ranked) == ["a", "b", "c"]
    after = ROUTING_LOG.counts()
    assert after.get("gpu_hit", 0) == before.get("gpu_hit", 0) + 1
    _choose(router, replicas, _pending(Snapshot()))  # a cache call, routed by the policy
    assert ROUTING_LOG.counts() == after
    assert ROUTING_LOG.policy == "affinity_until_saturated"


def test_a_malformed_report_counts_as_none() -> None:
    router = _router(seed=0)
    bad = encode_report(report("b", l0=[str(key())]))
    bad["v"] = 99
    replicas = [_replica("a", None), _replica("b", {REPORT_KEY: bad, SEQ_KEY: 1})]
    before = ROUTING_LOG.counts().get("no_report", 0)
    malformed = ROUTING_LOG.malformed_reports
    _choose(router, replicas, _pending(request(adapter=key())))
    assert ROUTING_LOG.counts().get("no_report", 0) == before + 1
    assert ROUTING_LOG.malformed_reports == malformed + 1


def test_unknown_router_kwargs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"request_router_kwargs \['colour'\] are unknown"):
        _router(policy="pow2", colour="red")
    with pytest.raises(ValueError, match="policy_name 'nope' is unknown"):
        _router(policy="nope")
    with pytest.raises(ValueError, match="max_queued"):
        _router(router_config={"max_queued": 0})


# --- stale reports age out of the rotation (a frozen replica's last stats stay "up") ----------


def test_a_report_is_stale_once_older_than_the_bound_and_none_is_never_stale() -> None:
    stamped = report("a", at_s=10.0)
    assert not is_stale(stamped, now_s=13.0, stale_after_s=3.0)  # exactly the bound: fresh
    assert is_stale(stamped, now_s=13.01, stale_after_s=3.0)
    assert not is_stale(None, now_s=1e9, stale_after_s=3.0)  # not reported yet: starting


def test_in_rotation_drops_stale_and_down_replicas_unless_none_would_remain() -> None:
    up = {UP_KEY: True}
    replicas = {"a": _replica("a", up), "b": _replica("b", up), "c": _replica("c", None)}
    reports = {"a": report("a", at_s=9.0), "b": report("b", at_s=5.0), "c": None}
    assert sorted(in_rotation(replicas, reports, now_s=10.0, stale_after_s=3.0)) == ["a", "c"]
    assert sorted(in_rotation(replicas, reports, now_s=10.0, stale_after_s=6.0)) == ["a", "b", "c"]
    all_stale = {"a": report("a", at_s=1.0), "b": report("b", at_s=1.0), "c": report("c")}
    assert len(in_rotation(replicas, all_stale, now_s=10.0, stale_after_s=3.0)) == 3


def test_a_replica_whose_reports_stop_leaves_the_rotation_and_returns_when_they_resume() -> None:
    """A frozen replica: Ray keeps handing the router its last routing stats (``up`` true, the
    same report); once that report is older than ``stale_after_s`` on the router's clock the
    replica is out, and its next new report brings it back."""
    clock = ManualClock(100.0)
    router = _router(seed=0, stale_after_s=3.0, clock=clock)
    revision = str(key())
    frozen = {**_stats(report("b", at_s=7.0, l0=[revision])), UP_KEY: True}
    a_stats = {**_stats(report("a", at_s=7.0)), UP_KEY: True}
    replicas = [_replica("a", a_stats), _replica("b", frozen)]
    pending = _pending(request(adapter=key()))
    assert _choose(router, replicas, pending)[0] == "b"  # it holds the revision in L0
    clock.advance(3.0)
    assert _choose(router, replicas, pending)[0] == "b"  # at the bound: still fresh
    clock.advance(0.5)
    replicas[0] = _replica("a", {**_stats(report("a", at_s=10.5)), UP_KEY: True})
    for _ in range(5):  # b's report is 3.5 s old; a reports on
        assert _choose(router, replicas, pending) == ["a"]
    resumed = {**_stats(report("b", at_s=11.0, l0=[revision])), UP_KEY: True}
    replicas[1] = _replica("b", resumed)
    assert _choose(router, replicas, pending)[0] == "b"
    clock.advance(10.0)  # both silent: every replica is offered rather than none
    assert sorted(_choose(router, replicas, pending)) == ["a", "b"]


def test_a_retry_avoids_its_lost_replica_and_still_skips_stale_ones() -> None:
    clock = ManualClock(0.0)
    router = _router(seed=0, stale_after_s=2.0, clock=clock)
    replicas = [_replica(i, _stats(report(i, at_s=1.0))) for i in ("a", "b", "c")]
    _choose(router, replicas, _pending(request()))  # every report stamped at 0
    clock.advance(5.0)
    replicas[1] = _replica("b", _stats(report("b", at_s=6.0)))  # only b reported since
    retry = _pending(request(), hint=RouteHint(avoid=frozenset({"b"})))
    assert sorted(_choose(router, replicas, retry)) == ["a", "c"]  # all else stale: not none
    retry_a = _pending(request(), hint=RouteHint(avoid=frozenset({"a"})))
    assert _choose(router, replicas, retry_a) == ["b"]


def test_a_topology_dedicates_a_replica_asks_it_and_steers_its_revision_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(TOPOLOGY_ASKS, "send", lambda rid, adapter: asked.append((rid, adapter)))
    # one request is enough here (``min_requests``' own test: tests/router/test_router_topology)
    topology = {"window_s": 30.0, "min_requests": 1}
    router = _router(seed=0, topology=topology, clock=ManualClock())
    revision = str(key())
    replicas = [
        _replica("a", _stats(report("a", l0=[revision], num_queued=1))),
        _replica("b", _stats(report("b", l0=[revision]))),
    ]
    before = ROUTING_LOG.counts().get("merged", 0)
    for _ in range(3):  # all the routed work: two replicas' worth, so one is dedicated
        assert _choose(router, replicas, _pending(request(adapter=key())))[0] == "b"
    assert asked == [("b", revision)]  # asked once, the less loaded holder
    assert ROUTING_LOG.counts()["merged"] == before + 3
    _choose(router, replicas, _pending(Snapshot()))  # cache calls are not counted as work
    assert asked == [("b", revision)]


def test_a_call_ray_asks_about_again_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Serve calls ``choose_replicas`` again, every backoff, for a call no replica took (all
    at ``max_ongoing_requests``): the same pending call, the same internal request id. NOTE: each
    such call counted as routed work and as a decision again, so one waiting request reached a
    topology's ``min_requests`` and a dedication by itself."""
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(TOPOLOGY_ASKS, "send", lambda rid, adapter: asked.append((rid, adapter)))
    router = _router(seed=0, topology={"min_requests": 2}, clock=ManualClock())
    revision = str(key())
    replicas = [_replica(i, _stats(report(i, l0=[revision]))) for i in ("a", "b")]

    def call(call_id: str) -> SimpleNamespace:
        pending = _pending(request(adapter=key()))
        pending.metadata = SimpleNamespace(internal_request_id=call_id)
        return pending

    waiting = call("call-1")
    before = sum(ROUTING_LOG.counts().values())
    for _ in range(6):  # one call, its first try and five backoffs
        _choose(router, replicas, waiting)
    assert sum(ROUTING_LOG.counts().values()) == before + 1
    assert asked == []  # one request in the window: below min_requests
    _choose(router, replicas, call("call-2"))  # a second call is a second request
    assert sum(ROUTING_LOG.counts().values()) == before + 2
    assert [adapter for _, adapter in asked] == [revision]


def test_first_tries_are_bounded_and_calls_without_an_id_always_count() -> None:
    tries = FirstTries(max_remembered=2)
    ids = [SimpleNamespace(metadata=SimpleNamespace(internal_request_id=i)) for i in "abc"]
    assert [tries.first(p) for p in ids] == [True, True, True]
    assert [tries.first(p) for p in ids[1:]] == [False, False]
    assert tries.first(ids[0])  # forgotten past the bound: counted again
    assert tries.first(SimpleNamespace(args=[])) and tries.first(SimpleNamespace(args=[]))


def test_a_call_still_asked_about_is_kept_past_the_bound_of_newer_calls() -> None:
    """``FirstTries``' NOTE: each ask moves a call to the end, so only calls first asked
    between two of its asks push it out, never the total asked while it waits."""
    tries = FirstTries(max_remembered=2)
    waiting = SimpleNamespace(metadata=SimpleNamespace(internal_request_id="waiting"))
    assert tries.first(waiting)
    for i in range(10):  # a newer call between every two backoff asks
        assert tries.first(SimpleNamespace(metadata=SimpleNamespace(internal_request_id=i)))
        assert not tries.first(waiting)


def test_a_call_ray_asks_about_again_is_pending_only_where_it_was_sent_last() -> None:
    """Each backoff ask chose a replica and marked the call pending there again: one waiting
    call looked like six requests queued (spread over the replicas) until their next reports."""
    router = _router(policy="pow2", seed=0, clock=ManualClock())
    replicas = [_replica(i) for i in ("a", "b", "c")]
    waiting = _pending(request(adapter=key()))
    waiting.metadata = SimpleNamespace(internal_request_id="call-1")
    chosen = [_choose(router, replicas, waiting)[0] for _ in range(6)]  # a try and 5 backoffs
    views = router._router.view(dict.fromkeys(("a", "b", "c")))
    pending = {v.replica_id: v.pending.num_requests for v in views}
    assert pending == {i: int(i == chosen[-1]) for i in ("a", "b", "c")}
    assert len(set(chosen)) > 1  # the asks went to several replicas (seeded): each was undone
    _choose(router, replicas, _pending(request()))  # a call without an id is always new
    views = router._router.view(dict.fromkeys(("a", "b", "c")))
    assert sum(v.pending.num_requests for v in views) == 2


def test_a_request_refused_before_its_first_token_is_uncounted_from_the_topology(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's requests refused or cancelled at once weighed toward a dedication: its
    revision won the merged replica with work no replica did."""
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(TOPOLOGY_ASKS, "send", lambda rid, adapter: asked.append((rid, adapter)))
    unadmitted = Unadmitted()
    monkeypatch.setattr("loraplex.fleet.routing.UNADMITTED", unadmitted)
    router = _router(seed=0, topology={"min_requests": 3}, clock=ManualClock())
    revision = str(key())
    replicas = [_replica(i, _stats(report(i, l0=[revision]))) for i in ("a", "b")]
    for i in range(2):  # two refused at once: uncounted
        _choose(router, replicas, _pending(request(f"r{i}", adapter=key())))
        unadmitted.withdraw("acme", f"r{i}")
    unadmitted.withdraw("acme", "r0")  # twice: nothing more
    _choose(router, replicas, _pending(request("ok", adapter=key())))
    unadmitted.admitted("acme", "ok")  # its first token: counted for good
    unadmitted.withdraw("acme", "ok")
    assert asked == []  # one request in the window: below min_requests
    for i in range(2):
        _choose(router, replicas, _pending(request(f"more{i}", adapter=key())))
    assert [adapter for _, adapter in asked] == [revision]


def test_unadmitted_is_bounded_and_keyed_by_tenant() -> None:
    undone: list[str] = []
    unadmitted = Unadmitted(max_remembered=2)
    for name in ("x", "y", "z"):
        unadmitted.counted("acme", name, lambda name=name: undone.append(name))
    unadmitted.withdraw("other", "y")  # another tenant's request of the same id
    for name in ("x", "y", "z"):
        unadmitted.withdraw("acme", name)
    assert undone == ["y", "z"]  # x was pushed out: counted for good


def _b_holds_globex_and_acme() -> tuple[LoraplexRequestRouter, list[Any], Any, Any]:
    """A router over replicas a, b, c that reported at 5.0 (the clock's now): b holds globex's
    ``search`` and acme's ``support`` in L0, the others nothing."""
    router = _router(seed=0, clock=ManualClock(5.0))
    hot, own = key("search", tenant="globex"), key("support", tenant="acme")
    b_holds = _stats(report("b", at_s=5.0, l0=[str(hot), str(own)]))
    replicas = [_replica("a", _stats(report("a", at_s=5.0))), _replica("b", b_holds)]
    replicas.append(_replica("c", _stats(report("c", at_s=5.0))))
    return router, replicas, hot, own


def test_a_request_that_ends_before_its_first_token_is_no_longer_a_replicas_pending_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's requests cancelled (or refused) at once stayed its replica's pending load in
    the router's memory until that replica's next report: 8 of them made the replica holding
    another tenant's hot revision look saturated (``max_queued``), and that tenant's request
    went to another replica to load its revision cold (docs/benchmarks/attackfleet.md)."""
    unadmitted = Unadmitted()
    monkeypatch.setattr("loraplex.fleet.routing.UNADMITTED", unadmitted)
    router, replicas, hot, own = _b_holds_globex_and_acme()
    for i in range(8):  # the attacker's requests, each cancelled before its first token
        assert _choose(router, replicas, _pending(request(f"x{i}", adapter=own)))[0] == "b"
        unadmitted.withdraw("acme", f"x{i}")
    victim = request("v", adapter=hot, tenant="globex")
    before = ROUTING_LOG.counts().get("gpu_hit", 0)
    assert _choose(router, replicas, _pending(victim))[0] == "b"
    assert ROUTING_LOG.counts().get("gpu_hit", 0) == before + 1
    # requests that did start (a first token) are load until the replica's next report
    for i in range(8):
        _choose(router, replicas, _pending(request(f"y{i}", adapter=own)))
        unadmitted.admitted("acme", f"y{i}")
        unadmitted.withdraw("acme", f"y{i}")  # its end: counted for good
    later = request("v2", adapter=hot, tenant="globex")
    assert _choose(router, replicas, _pending(later))[0] != "b"  # b saturated: load wins


def test_a_withdrawn_call_is_forgotten_where_its_last_backoff_ask_sent_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """And a backoff ask after the withdrawal marks it pending nowhere: Ray Serve asks again
    after its backoff sleep before it looks whether the call was cancelled
    (``_choose_replicas_with_backoff`` asks, then ``_fulfill_pending_requests`` checks
    ``future.done()``), and that ask marked the call pending again on the replica it chose, with
    no undo left (until that replica's next report). The late ask is still ranked."""
    unadmitted = Unadmitted()
    monkeypatch.setattr("loraplex.fleet.routing.UNADMITTED", unadmitted)
    router = _router(policy="pow2", seed=0, clock=ManualClock())
    replicas = [_replica(i) for i in ("a", "b", "c")]
    waiting = _pending(request("w", adapter=key()))
    waiting.metadata = SimpleNamespace(internal_request_id="call-1")
    chosen = [_choose(router, replicas, waiting)[0] for _ in range(4)]  # a try and 3 backoffs
    assert len(set(chosen)) > 1  # seeded: the asks moved it
    unadmitted.withdraw("acme", "w")  # cancelled while it waited
    views = router._router.view(dict.fromkeys(("a", "b", "c")))
    assert sum(v.pending.num_requests for v in views) == 0
    for _ in range(3):  # Ray's late asks, before it sees the call cancelled
        assert sorted(_choose(router, replicas, waiting)) == ["a", "b", "c"]
    views = router._router.view(dict.fromkeys(("a", "b", "c")))
    assert sum(v.pending.num_requests for v in views) == 0


def test_a_request_withdrawn_before_the_routers_ask_ran_is_not_kept_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray Serve routes on its own event loop: a request whose client left within milliseconds
    was withdrawn by the engine client before the router's ask for it ran. The ask then kept
    its undo (the call and its prompt, until 65,536 newer ones pushed it out) and left its
    decision pending on its replica until the next report (scripts/attacks/attackfleet2)."""
    unadmitted = Unadmitted()
    monkeypatch.setattr("loraplex.fleet.routing.UNADMITTED", unadmitted)
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(TOPOLOGY_ASKS, "send", lambda rid, adapter: asked.append((rid, adapter)))
    router = _router(seed=0, topology={"min_requests": 2}, clock=ManualClock())
    replicas = [_replica(i) for i in ("a", "b", "c")]
    for i in range(3):
        unadmitted.withdraw("acme", f"gone{i}")  # the client left: the engine client's finally
        late = _pending(request(f"gone{i}", adapter=key()))
        late.metadata = SimpleNamespace(internal_request_id=f"call-{i}")
        _choose(router, replicas, late)  # the router's ask, run after
    views = router._router.view(dict.fromkeys(("a", "b", "c")))
    assert sum(v.pending.num_requests for v in views) == 0
    assert unadmitted._undo == {}  # nothing kept for a request that ended
    assert asked == []  # no dedication from requests that were never served
    _choose(router, replicas, _pending(request("gone0", adapter=key())))  # the id again: counted
    assert list(unadmitted._undo) == [("acme", "gone0")]


def test_unadmitted_remembers_a_bounded_number_of_ended_requests() -> None:
    undone: list[str] = []
    unadmitted = Unadmitted(max_ended=2)
    for name in ("x", "y", "z"):
        unadmitted.withdraw("acme", name)  # ended before they were counted
    assert unadmitted.counted("acme", "x", lambda: undone.append("x"))  # pushed out: kept
    assert not unadmitted.counted("acme", "y", lambda: undone.append("y"))
    assert unadmitted.counted("other", "z", lambda: undone.append("z"))  # another tenant's
    assert undone == []  # the caller undoes a request counted after its end


def test_requests_answered_before_their_replicas_next_report_are_not_its_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request that had its first token counted as its replica's pending load until that
    replica's next report even when it had ended by then: a tenant sending 1-token completions
    back to back (two clients, on the demo fleet) saturated every replica in the router's eyes,
    and another tenant's requests went to replicas without its revisions in L0
    (docs/benchmarks/attackfleet2.md)."""
    unadmitted = Unadmitted()
    monkeypatch.setattr("loraplex.fleet.routing.UNADMITTED", unadmitted)
    router, replicas, hot, own = _b_holds_globex_and_acme()
    for i in range(16):  # answered in full, one after another, within one report period
        assert _choose(router, replicas, _pending(request(f"x{i}", adapter=own)))[0] == "b"
        unadmitted.admitted("acme", f"x{i}")
        unadmitted.ended("acme", f"x{i}")
    views = {v.replica_id: v for v in router._router.view(dict.fromkeys(("a", "b", "c")))}
    assert views["b"].pending.num_requests == 0
    assert str(own) in views["b"].pending.adapter_keys  # still where acme's revision went
    victim = request("v", adapter=hot, tenant="globex")
    assert _choose(router, replicas, _pending(victim))[0] == "b"
    assert unadmitted._running == {}
