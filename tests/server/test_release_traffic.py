"""ReleaseTraffic: windows, bounds, error classification; RecentRequests: bounds and TTL."""

from __future__ import annotations

import pytest
from fakes import FakeEngine

from loraplex.clock import ManualClock
from loraplex.errors import (
    AdapterTooLargeError,
    CorruptArtifactError,
    EngineUnavailableError,
    GenerationError,
    InvalidRequestError,
    LoadCancelledError,
    PromptTooLongError,
    QueueFullError,
    QueueTimeoutError,
    RateLimitError,
)
from loraplex.release.traffic import (
    BASELINE,
    CANDIDATE,
    ReleaseTraffic,
    TrackedRevision,
    Verdict,
    caller_key,
    classify,
    percentile,
)
from loraplex.server.metrics import ServerMetrics
from loraplex.server.recent_requests import RecentRequests

CAND = "acme/support@r2"
BASE = "acme/support@r1"


def _tracked(*refs: str) -> list[TrackedRevision]:
    roles = [CANDIDATE, BASELINE]
    return [TrackedRevision(ref, "rel-1", roles[i % 2], "canary") for i, ref in enumerate(refs)]


def _traffic(clock: ManualClock, **kwargs: int) -> ReleaseTraffic:
    traffic = ReleaseTraffic(clock, tuple, **kwargs)
    traffic.set_tracked(_tracked(CAND, BASE))
    return traffic


@pytest.mark.parametrize(
    ("outcome", "error", "verdict"),
    [
        ("stop", None, Verdict.OK),
        ("length", None, Verdict.OK),
        ("abort", None, Verdict.EXCLUDED),  # the client went away
        ("error", InvalidRequestError("bad", "prompt"), Verdict.EXCLUDED),
        ("error", PromptTooLongError("too long"), Verdict.EXCLUDED),
        ("error", QueueFullError("queue", 4, 1.0), Verdict.EXCLUDED),
        ("error", RateLimitError("acme", 1.0, 1.0), Verdict.EXCLUDED),
        ("error", GenerationError("r", "nan logits"), Verdict.ERROR),
        ("error", CorruptArtifactError("truncated"), Verdict.ERROR),  # the revision's load
        ("error", LoadCancelledError("cancelled"), Verdict.ERROR),
        ("error", AdapterTooLargeError("too big"), Verdict.ERROR),
        ("error", QueueTimeoutError("r", 5.0, 1.0), Verdict.ERROR),
        ("error", EngineUnavailableError("down"), Verdict.ERROR),
        ("error", RuntimeError("bug"), Verdict.ERROR),
        ("error", None, Verdict.ERROR),  # a failure of unknown cause counts
    ],
)
def test_classify(outcome: str, error: BaseException | None, verdict: Verdict) -> None:
    assert classify(outcome, error) is verdict


def test_a_generation_failure_counts_only_when_it_is_the_models() -> None:
    sampling = GenerationError("r", "penalty overflow", model_fault=False)
    assert classify("error", sampling) is Verdict.EXCLUDED
    assert classify("error", GenerationError("r", "non-finite logits")) is Verdict.ERROR


def test_caller_key_is_the_tenant_unless_it_owns_the_alias() -> None:
    assert caller_key(CAND, "globex", "user:a", "1") == caller_key(CAND, "globex", None, "2")
    assert caller_key(CAND, "acme", "user:a", "1") == caller_key(CAND, "acme", "user:a", "2")
    assert caller_key(CAND, "acme", "user:a", "1") != caller_key(CAND, "acme", "user:b", "1")
    assert caller_key(CAND, "acme", None, "1") != caller_key(CAND, "acme", None, "2")


def test_window_names_the_caller_that_failed_and_rated_worst() -> None:
    clock = ManualClock(1.0)
    traffic = _traffic(clock)
    for _ in range(12):
        traffic.record(CAND, Verdict.ERROR, None, None, "tenant:globex")
        traffic.record_feedback(CAND, 1.0, good=False, caller="tenant:globex")
    for i in range(10):
        traffic.record(CAND, Verdict.OK, 0.1, None, f"owner:user:{i}")
    traffic.record(CAND, Verdict.ERROR, None, None, "owner:user:0")
    traffic.record_feedback(CAND, 1.0, good=True, caller="owner:user:3")
    window = traffic.window(CAND, 0.0)
    assert (window.requests, window.errors, window.callers) == (23, 13, 11)
    assert (window.top_caller_requests, window.top_caller_errors) == (12, 12)
    assert (window.good, window.bad, window.top_rater_good, window.top_rater_bad) == (1, 12, 0, 12)
    # of the rest, the caller with the most successes (ties: fewest failures) and the best rater
    assert (window.best_caller_requests, window.best_caller_errors) == (1, 0)
    assert (window.best_rater_good, window.best_rater_bad) == (1, 0)
    rest = window.without_top_callers()
    assert (rest.requests, rest.errors, rest.good, rest.bad) == (10, 1, 0, 0)
    assert (window.ttft_samples, window.tpot_samples) == (10, 0)


def test_window_without_errors_leaves_out_only_the_most_successful_caller() -> None:
    traffic = _traffic(ManualClock())
    for _ in range(5):
        traffic.record(CAND, Verdict.OK, 0.1, 0.01, "tenant:globex")
    traffic.record(CAND, Verdict.OK, 0.1, 0.01, "owner:user:1")
    window = traffic.window(CAND, 0.0)
    assert (window.callers, window.top_caller_requests, window.top_caller_errors) == (2, 0, 0)
    assert (window.best_caller_requests, window.best_caller_errors) == (5, 0)
    assert window.without_top_callers().requests == 1


def test_window_counts_percentiles_and_since() -> None:
    clock = ManualClock(100.0)
    traffic = _traffic(clock)
    for i in range(10):
        traffic.record(CAND, Verdict.OK, 0.01 * (i + 1), 0.001 * (i + 1))
    clock.advance(5.0)
    traffic.record(CAND, Verdict.ERROR, None, None)
    traffic.record(CAND, Verdict.EXCLUDED, 9.0, 9.0)
    traffic.record(BASE, Verdict.OK, 0.5, None)
    window = traffic.window(CAND, 100.0)
    assert (window.requests, window.errors) == (11, 1)
    assert window.ttft_p50_s == pytest.approx(0.05)
    assert window.ttft_p99_s == pytest.approx(0.10)
    assert window.tpot_p99_s == pytest.approx(0.010)
    later = traffic.window(CAND, 104.0)
    assert (later.requests, later.errors, later.ttft_p50_s) == (1, 1, None)
    assert later.error_rate == 1.0
    baseline = traffic.window(BASE, 0.0)
    assert (baseline.requests, baseline.ttft_p99_s, baseline.tpot_p50_s) == (1, 0.5, None)


def test_ring_is_bounded_and_keeps_the_newest() -> None:
    clock = ManualClock()
    traffic = _traffic(clock, max_samples=3)
    for i in range(5):
        clock.advance(1.0)
        traffic.record(CAND, Verdict.OK, float(i), None)
    window = traffic.window(CAND, 0.0)
    assert window.requests == 3
    assert window.ttft_p50_s == 3.0  # samples 2, 3, 4 remain
    (totals,) = [t for tracked, t in traffic.totals() if tracked.ref == CAND]
    assert totals.ok == 5  # the counter is cumulative; only the ring is bounded


def test_untracked_revisions_are_not_recorded_and_leave_with_their_release() -> None:
    clock = ManualClock()
    traffic = _traffic(clock)
    assert traffic.record("acme/legal@r1", Verdict.OK, 0.1, None) is None
    assert traffic.window("acme/legal@r1", 0.0).requests == 0
    traffic.record(CAND, Verdict.OK, 0.1, None)
    traffic.set_tracked(_tracked(BASE))  # the release of CAND ended
    assert not traffic.is_tracked(CAND)
    assert traffic.window(CAND, 0.0).requests == 0
    assert [tracked.ref for tracked, _ in traffic.totals()] == [BASE]


def test_max_tracked_caps_the_set() -> None:
    traffic = ReleaseTraffic(ManualClock(), tuple, max_tracked=2)
    traffic.set_tracked(_tracked("a/x@1", "a/x@2", "a/y@1", "a/y@2"))
    assert [t.ref for t in traffic.tracked()] == ["a/x@1", "a/x@2"]


def test_refresh_reads_the_source_at_most_once_per_interval() -> None:
    clock = ManualClock()
    calls: list[float] = []

    def source() -> list[TrackedRevision]:
        calls.append(clock.now())
        return _tracked(CAND)

    traffic = ReleaseTraffic(clock, source, refresh_s=1.0)
    traffic.refresh()
    traffic.refresh()
    clock.advance(0.5)
    traffic.refresh()
    assert calls == [0.0]
    clock.advance(0.5)
    traffic.refresh()
    traffic.refresh(force=True)
    assert calls == [0.0, 1.0, 1.0]
    assert traffic.is_tracked(CAND)


def test_feedback_counts_by_when_the_request_was_served() -> None:
    clock = ManualClock(10.0)
    traffic = _traffic(clock)
    assert traffic.record_feedback(CAND, 5.0, good=False)
    assert traffic.record_feedback(CAND, 12.0, good=True)
    assert not traffic.record_feedback("acme/legal@r1", 12.0, good=True)
    window = traffic.window(CAND, 10.0)
    assert (window.good, window.bad) == (1, 0)
    assert (traffic.window(CAND, 0.0).good, traffic.window(CAND, 0.0).bad) == (1, 1)


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0


def test_recent_requests_bounded_lru_and_ttl() -> None:
    clock = ManualClock()
    recent = RecentRequests(clock, max_entries=2, ttl_s=10.0)
    recent.remember("acme", "a", CAND, "c1")
    recent.remember("acme", "b", None, "c2")
    recent.remember("globex", "c", BASE, "c3")
    assert recent.get("acme", "a") is None and len(recent) == 2  # the largest tenant's oldest
    served = recent.get("globex", "c")
    assert served is not None and (served.revision, served.caller) == (BASE, "c3")
    clock.advance(10.0)
    assert recent.get("globex", "c") is None and recent.get("acme", "b") is None
    assert len(recent) == 0


def test_recent_request_is_claimed_once() -> None:
    recent = RecentRequests(ManualClock())
    recent.remember("acme", "a", CAND, "c1")
    first = recent.claim("acme", "a")
    assert first is not None and not first.rated
    again = recent.claim("acme", "a")
    assert again is not None and again.rated
    assert recent.claim("acme", "missing") is None


def test_same_id_from_two_tenants_keeps_two_entries() -> None:
    recent = RecentRequests(ManualClock())
    recent.remember("acme", "trace-0001", CAND, "owner")
    recent.remember("globex", "trace-0001", BASE, "tenant:globex")
    acme, globex = recent.claim("acme", "trace-0001"), recent.claim("globex", "trace-0001")
    assert acme is not None and (acme.revision, acme.rated) == (CAND, False)
    assert globex is not None and (globex.revision, globex.rated) == (BASE, False)
    assert recent.claim("initech", "trace-0001") is None
    assert len(recent) == 2


def test_reused_id_within_a_tenant_is_the_newer_request() -> None:
    clock = ManualClock()
    recent = RecentRequests(clock)
    recent.remember("acme", "trace-0001", CAND, "c1")
    assert recent.claim("acme", "trace-0001") is not None
    clock.advance(5.0)
    recent.remember("acme", "trace-0001", BASE, "c2")
    newer = recent.claim("acme", "trace-0001")
    assert newer is not None and (newer.revision, newer.at_s, newer.rated) == (BASE, 5.0, False)
    assert len(recent) == 1


def test_a_flooding_tenant_evicts_only_its_own_entries() -> None:
    recent = RecentRequests(ManualClock(), max_entries=6, max_entries_per_tenant=4)
    recent.remember("acme", "mine-1", CAND, "c")
    recent.remember("acme", "mine-2", CAND, "c")
    for i in range(100):
        recent.remember("globex", f"flood-{i}", BASE, "g")
    assert recent.get("acme", "mine-1") is not None and recent.get("acme", "mine-2") is not None
    assert recent.get("globex", "flood-95") is None and recent.get("globex", "flood-99")
    assert len(recent) == 6
    for i in range(3):  # a third tenant past the global cap: the largest (globex) pays
        recent.remember("initech", f"i-{i}", None, "i")
    assert recent.get("acme", "mine-1") is not None and len(recent) == 6
    assert recent.get("globex", "flood-96") is None and recent.get("globex", "flood-99")


def test_past_the_global_cap_a_tenant_tied_at_the_top_pays_for_its_own_entry() -> None:
    # attack29: tied at the most, the first tenant in insertion order (globex) paid for acme's
    # new entry, so acme's traffic dropped globex's recent requests (their feedback 404'd)
    recent = RecentRequests(ManualClock(), max_entries=4, max_entries_per_tenant=2)
    recent.remember("globex", "g-1", BASE, "g")
    recent.remember("globex", "g-2", BASE, "g")
    recent.remember("acme", "a-1", CAND, "a")
    recent.remember("initech", "i-1", None, "i")
    recent.remember("acme", "a-2", CAND, "a")  # 5 > 4: acme and globex hold 2 each
    assert recent.get("globex", "g-1") is not None and recent.get("globex", "g-2") is not None
    assert recent.get("acme", "a-1") is None and recent.get("acme", "a-2") is not None
    assert len(recent) == 4


def test_expired_entries_of_idle_tenants_never_push_out_live_ones() -> None:
    # attack29: expiry ran per tenant on its own calls, so idle tenants' expired entries still
    # counted towards the global cap, and a live tenant's entries went in their place
    clock = ManualClock()
    recent = RecentRequests(clock, max_entries=4, max_entries_per_tenant=3, ttl_s=10.0)
    for tenant in ("initech", "hooli"):
        recent.remember(tenant, f"{tenant}-1", None, "x")
        recent.remember(tenant, f"{tenant}-2", None, "x")
    clock.advance(11.0)  # initech's and hooli's entries have expired; neither calls again
    for i in range(3):
        recent.remember("globex", f"g-{i}", BASE, "g")
    assert [recent.get("globex", f"g-{i}") is not None for i in range(3)] == [True] * 3
    assert len(recent) == 3


def test_observation_feeds_the_window_with_its_verdict() -> None:
    clock = ManualClock()
    traffic = _traffic(clock)
    metrics = ServerMetrics(
        FakeEngine(), None, releases=traffic, recent=RecentRequests(clock), model_name="base"
    )
    shed = metrics.start_request("normal", False, 0.0, revision=CAND, tenant="acme")
    shed.fail(QueueFullError("queue", 4, 1.0))
    shed.finish("error")
    failed = metrics.start_request("normal", False, 0.0, revision=CAND, tenant="acme")
    failed.fail(GenerationError("x", "nan"))
    failed.finish("error")
    base = metrics.start_request("normal", False, 0.0, revision=None, tenant="acme")
    base.finish("stop")
    window = traffic.window(CAND, 0.0)
    assert (window.requests, window.errors) == (1, 1)
    kept = metrics.start_request(
        "normal", False, 0.0, revision=CAND, tenant="acme", response_id="cmpl-1"
    )
    kept.finish("stop")
    entry = metrics.recent.get("acme", "cmpl-1")
    assert entry is not None and entry.revision == CAND
    assert metrics.recent.get("globex", "cmpl-1") is None
    assert traffic.window(CAND, 0.0).requests == 2


def test_a_window_holds_what_finished_since_and_ratings_of_requests_served_since() -> None:
    clock = ManualClock(1.0)
    traffic = _traffic(clock)
    old_served = clock.now()
    traffic.record(CAND, Verdict.OK, 0.1, None, "u1")  # finished at 1.0
    clock.advance(1.0)
    since = clock.now()  # 2.0: the step starts
    new_served = clock.now()
    traffic.record(CAND, Verdict.OK, 0.2, None, "u2")
    traffic.record(CAND, Verdict.ERROR, None, None, "u3")
    clock.advance(1.0)
    traffic.record_feedback(CAND, old_served, False, "u1")  # rated now, served before the step
    traffic.record_feedback(CAND, new_served, True, "u2")
    window = traffic.window(CAND, since)
    assert (window.requests, window.errors, window.good, window.bad) == (2, 1, 1, 0)
    assert window.ttft_p50_s == 0.2
    assert traffic.window(CAND, clock.now() + 1).requests == 0
