"""``affinity_until_saturated`` rule by rule on constructed reports: tier order, load penalties,
saturation, sessions, the router's memory of its own decisions, stale reports."""

from __future__ import annotations

import pytest
from router_kit import idle, make_router, report, req

from loraplex.router import Reason, RouteRequest

A = "t/a@1"


def test_tiers_order_gpu_over_loading_over_cpu_over_disk_over_absent() -> None:
    router, _ = make_router()
    fleet = {
        "disk": report("disk", l2=[A]),
        "cpu": report("cpu", l1=[A]),
        "gpu": report("gpu", l0=[A]),
        "loading": report("loading", loading=[A]),
        "none": report("none"),
    }
    decision = router.choose(req(), fleet)
    assert decision.ranked == ("gpu", "loading", "cpu", "disk", "none")
    assert decision.reason is Reason.GPU_HIT
    # Take the best away, one at a time: the next tier wins, with its reason.
    for gone, (replica_id, reason) in zip(
        ("gpu", "loading", "cpu"),
        [("loading", Reason.PLACEMENT), ("cpu", Reason.CPU_HIT), ("disk", Reason.DISK_HIT)],
        strict=True,
    ):
        del fleet[gone]
        router, _ = make_router()
        decision = router.choose(req(), fleet)
        assert (decision.replica_id, decision.reason) == (replica_id, reason)


def test_queue_depth_is_a_penalty_but_gpu_residency_dominates_it() -> None:
    router, _ = make_router()
    fleet = {"a": report("a", l0=[A], queued=3), "b": report("b", l0=[A], queued=1)}
    assert router.choose(req(), fleet).replica_id == "b"
    router, _ = make_router()
    fleet = {"gpu": report("gpu", l0=[A], queued=6), "cpu": report("cpu", l1=[A])}
    assert router.choose(req(), fleet).ranked == ("gpu", "cpu")


@pytest.mark.parametrize(("field", "value"), [("tokens", 4000), ("evictions", 10.0)])
def test_active_tokens_and_recent_evictions_are_penalties(field: str, value: float) -> None:
    router, _ = make_router()
    fleet = {"a": report("a", l0=[A], **{field: value}), "b": report("b", l0=[A])}  # type: ignore[arg-type]
    assert router.choose(req(), fleet).ranked == ("b", "a")


def test_pinned_copy_wins_a_tie() -> None:
    router, _ = make_router()
    fleet = {"a": report("a", l1=[A]), "b": report("b", l1=[A], pinned=[A])}
    assert router.choose(req(), fleet).replica_id == "b"


@pytest.mark.parametrize("load", [{"queued": 8}, {"kv": 0.95}])
def test_past_saturation_load_wins(load: dict[str, float]) -> None:
    router, _ = make_router()
    fleet = {
        "hot": report("hot", l0=[A], **load),  # type: ignore[arg-type]
        "busy": report("busy", queued=5),
        "idle": report("idle", queued=1),
    }
    decision = router.choose(req(), fleet)
    assert decision.replica_id == "idle"
    assert decision.reason is Reason.SATURATED
    assert decision.ranked[-1] == "hot"  # saturated replicas rank last


def test_pure_affinity_ignores_saturation() -> None:
    router, _ = make_router("affinity")
    fleet = {"hot": report("hot", l0=[A], queued=50), "idle": report("idle")}
    decision = router.choose(req(), fleet)
    assert (decision.replica_id, decision.reason) == ("hot", Reason.GPU_HIT)


def test_an_unsaturated_holder_beats_an_idle_non_holder() -> None:
    router, _ = make_router()
    fleet = {"holder": report("holder", l2=[A], queued=7), "idle": report("idle")}
    decision = router.choose(req(), fleet)
    assert (decision.replica_id, decision.reason) == ("holder", Reason.DISK_HIT)


def test_every_replica_saturated_lets_the_score_decide() -> None:
    # No replica has room: moving the revision buys no capacity and costs a load (and an
    # eviction) where it lands, so residency minus load decides, as it does below saturation.
    router, _ = make_router()
    fleet = {"a": report("a", l0=[A], queued=20), "b": report("b", queued=9)}
    decision = router.choose(req(), fleet)
    assert (decision.replica_id, decision.reason) == ("a", Reason.SATURATED)
    # Load still counts: 25 more waiting requests (4 each) outweigh GPU residency (100).
    router, _ = make_router()
    fleet = {"a": report("a", l0=[A], queued=35), "b": report("b", queued=9)}
    assert router.choose(req(), fleet).replica_id == "b"
    # With an unsaturated replica, load wins outright (rule 4): it becomes a new holder.
    router, _ = make_router()
    fleet = {"a": report("a", l0=[A], queued=20), "b": report("b", queued=7)}
    assert router.choose(req(), fleet).replica_id == "b"


def test_session_sticks_while_unsaturated_and_moves_when_saturated() -> None:
    router, clock = make_router()
    fleet = {"a": report("a", l0=["t/x@1"]), "b": report("b", l0=["t/y@1"])}
    first = router.choose(req("t/x@1", session="u1"), fleet)
    assert first.replica_id == "a"
    # The same session asks for a revision resident on b: its KV prefix is on a.
    second = router.choose(req("t/y@1", session="u1"), fleet)
    assert (second.replica_id, second.reason) == ("a", Reason.SESSION)
    clock.advance(1.0)
    fleet = {"a": report("a", at_s=1.0, queued=8), "b": report("b", at_s=1.0, l0=["t/y@1"])}
    third = router.choose(req("t/y@1", session="u1"), fleet)
    assert (third.replica_id, third.reason) == ("b", Reason.GPU_HIT)
    fleet["a"] = report("a", at_s=1.0)
    fourth = router.choose(req("t/x@1", session="u1"), fleet)
    assert (fourth.replica_id, fourth.reason) == ("b", Reason.SESSION)  # re-stuck to b


def test_session_lapses_after_its_ttl() -> None:
    router, clock = make_router(session_ttl_s=5.0)
    router.choose(req(None, session="u"), idle("a", "b"))
    clock.advance(2.0)
    again = router.choose(req(None, session="u"), idle("a", "b", at_s=2.0))
    assert again.reason is Reason.SESSION
    clock.advance(6.0)
    later = router.choose(req(None, session="u"), idle("a", "b", at_s=8.0))
    assert later.reason is Reason.POW2


def test_base_model_requests_use_power_of_two_among_unsaturated() -> None:
    for seed in range(10):
        router, _ = make_router(seed=seed)
        fleet = {"a": report("a", queued=8), "b": report("b", queued=2), "c": report("c")}
        decision = router.choose(req(None), fleet)
        assert decision.reason is Reason.POW2
        assert decision.replica_id != "a"
        assert decision.ranked[-1] == "a"


def test_a_burst_between_reports_follows_the_first_decision_until_saturated() -> None:
    router, _ = make_router(max_queued=4)
    fleet = idle("r0", "r1", "r2", "r3", "r4", "r5")
    cold = "t/cold@1"
    decisions = [router.choose(req(cold), fleet) for _ in range(6)]
    first = decisions[0].replica_id
    assert decisions[0].reason is Reason.PLACEMENT
    # The next three see the revision "loading" on the first replica (routed there).
    assert [d.replica_id for d in decisions[1:4]] == [first] * 3
    # Four routed requests saturate it (max_queued=4): load wins and the revision spreads.
    assert decisions[4].replica_id != first
    assert decisions[4].reason is Reason.SATURATED


def test_a_newer_report_replaces_the_memory_of_decisions() -> None:
    router, clock = make_router()
    fleet = idle("a", "b", "c")
    cold = "t/cold@1"
    first = router.choose(req(cold), fleet).replica_id
    view = {v.replica_id: v for v in router.view(fleet)}[first]
    assert view.pending.num_requests == 1 and view.num_queued == 1
    clock.advance(0.5)
    newer = idle("a", "b", "c", at_s=0.5)  # the replica reports the revision gone (evicted)
    view = {v.replica_id: v for v in router.view(newer)}[first]
    assert view.pending.num_requests == 0
    assert view.tier_of(cold).name == "ABSENT"


def test_memory_lapses_after_its_ttl_without_reports() -> None:
    router, clock = make_router(recent_ttl_s=2.0, max_report_age_s=100.0)
    fleet = idle("a", "b")
    chosen = router.choose(req(), fleet).replica_id
    clock.advance(3.0)
    view = {v.replica_id: v for v in router.view(fleet)}[chosen]
    assert view.pending.num_requests == 0


def test_stale_reports_count_as_no_report() -> None:
    router, clock = make_router(max_report_age_s=3.0)
    fleet = {"a": report("a", l0=[A]), "b": report("b", at_s=4.0)}
    clock.advance(4.0)
    decision = router.choose(req(), fleet)  # a's report is 4 s old: its L0 copy is not trusted
    assert decision.ranked == ("b", "a")
    assert decision.reason is Reason.PLACEMENT
    clock.advance(10.0)
    assert router.choose(req(), fleet).reason is Reason.NO_REPORT


def test_unreported_replicas_rank_after_reported_ones() -> None:
    router, _ = make_router()
    decision = router.choose(req(), {"new": None, "old": report("old", queued=7)})
    assert decision.ranked == ("old", "new")


def test_bad_calls_are_refused() -> None:
    router, _ = make_router()
    with pytest.raises(ValueError, match="replicas is empty"):
        router.choose(req(), {})
    with pytest.raises(ValueError, match="replicas"):
        router.choose(req(), {"a": report("b")})
    with pytest.raises(ValueError, match="num_prompt_tokens"):
        RouteRequest(A, None, -1)
    with pytest.raises(ValueError, match="adapter_key"):
        RouteRequest("", None, 1)


def test_running_sequences_saturate_a_replica_and_count_in_its_load() -> None:
    """A replica running ``max_ongoing`` sequences is saturated even with nothing waiting (on a
    CPU or a busy GPU every running sequence slows each step); below that, running sequences
    weigh in the load penalty."""
    router, _ = make_router(max_ongoing=6)
    key = "t/hot@1"
    busy = {"a": report("a", l0=[key], running=6), "b": report("b"), "c": report("c")}
    decision = router.choose(req(key), busy)
    assert decision.reason is Reason.SATURATED and decision.replica_id != "a"
    # Two holders below saturation: the one with fewer running sequences wins.
    router, _ = make_router(max_ongoing=6)
    fleet = {"a": report("a", l0=[key], running=4), "b": report("b", l0=[key], running=1)}
    decision = router.choose(req(key), fleet)
    assert decision.reason is Reason.GPU_HIT and decision.replica_id == "b"


def test_requests_waiting_for_adapters_saturate_a_replica_only_for_cold_revisions() -> None:
    """A replica busy loading other adapters still serves a revision in its GPU slots at once (a
    request for it takes a seat at the next step), so its adapter waits do not move that
    traffic; a cold revision's load would queue behind them, so for placement they count."""
    key, cold = "t/hot@1", "t/cold@1"
    loading = {"a": report("a", l0=[key], adapter_wait=20), "b": report("b"), "c": report("c")}
    router, _ = make_router(max_queued=8, placement_k=3)
    decision = router.choose(req(key), loading)
    assert decision.reason is Reason.GPU_HIT and decision.replica_id == "a"
    # The same wait for a seat saturates it for every revision.
    router, _ = make_router(max_queued=8, placement_k=3)
    seated = {**loading, "a": report("a", l0=[key], queued=8)}
    assert router.choose(req(key), seated).reason is Reason.SATURATED
    # Placement over the whole fleet: "a" is saturated for a cold revision, and of "b" and "c"
    # the one with fewer adapter waits wins.
    router, _ = make_router(max_queued=8, placement_k=3)
    fleet = {**loading, "b": report("b", adapter_wait=3), "c": report("c", adapter_wait=1)}
    decision = router.choose(req(cold), fleet)
    assert decision.reason is Reason.PLACEMENT and decision.replica_id == "c"


def test_placement_goes_to_the_member_running_fewer_sequences() -> None:
    router, _ = make_router(placement_k=3)
    fleet = {"a": report("a", running=3), "b": report("b", running=0), "c": report("c", running=2)}
    decision = router.choose(req("t/cold@1"), fleet)
    assert decision.reason is Reason.PLACEMENT and decision.replica_id == "b"
