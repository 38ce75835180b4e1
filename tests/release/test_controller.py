"""The controller over a fake environment and a manual clock: every transition and failure."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FakeEnv
from registry_kit import write_adapter

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import ManualClock
from loraplex.registry import AliasTarget, RegistrationRequest, Registry, RevisionState
from loraplex.release.controller import ReleaseController
from loraplex.release.errors import ReleaseConflictError, ReleaseStartError
from loraplex.release.model import (
    MAX_PLAN_SECONDS,
    ProbeCase,
    Release,
    ReleasePlan,
    ReleaseState,
    RevisionWindow,
    Thresholds,
)
from loraplex.release.store import ReleaseStore
from loraplex.release.traffic import ReleaseTraffic

S = ReleaseState
PLAN = ReleasePlan(ladder=(0.1, 0.5), dwell_s=60.0, window_s=600.0, thresholds=Thresholds())
HEALTHY = RevisionWindow(requests=20, errors=0, ttft_p99_s=0.1, tpot_p99_s=0.02)


def _controller(registry: Registry, env: FakeEnv, clock: ManualClock) -> ReleaseController:
    return ReleaseController(registry, env, clock, actor="controller")


def _to_canary(registry: Registry, env: FakeEnv, clock: ManualClock, plan: ReleasePlan = PLAN):
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", "v2", plan, actor="ops")
    controller = _controller(registry, env, clock)
    for _ in range(3):  # staged -> prewarming -> probing -> canary
        controller.tick()
    release = store.latest_release("acme", "bot")
    assert release.state is S.CANARY, release
    return store, controller


def _started_and_ticked(
    registry: Registry,
    env: FakeEnv,
    clock: ManualClock,
    revision: str,
    plan: ReleasePlan,
    ticks: int,
) -> Release:
    """A release of ``revision`` started, then ``ticks`` controller ticks; the release then."""
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", revision, plan, actor="ops")
    controller = _controller(registry, env, clock)
    for _ in range(ticks):
        controller.tick()
    return store.latest_release("acme", "bot")


def _audited(registry: Registry) -> list[str]:
    return [e.action for e in registry.audit_log() if e.action.startswith("release.")]


def _served(registry: Registry, num_callers: int = 200) -> set[str]:
    return {
        registry.resolve_revision("acme", "bot", sticky_key=f"user-{i}").revision
        for i in range(num_callers)
    }


def test_a_good_release_climbs_the_ladder_and_is_promoted(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    assert env.prewarmed == [("v2", False)]
    assert env.pinned == {"v1", "v2"}  # the stable revision stays resident throughout
    env.windows = {"acme/bot@v2": HEALTHY, "acme/bot@v1": HEALTHY}

    clock.advance(30.0)
    controller.tick()
    assert store.latest_release("acme", "bot").step == 0  # dwell not over
    clock.advance(31.0)
    controller.tick()
    stepped = store.latest_release("acme", "bot")
    assert (stepped.state, stepped.step, stepped.step_started_at) == (S.CANARY, 1, clock.now())
    clock.advance(61.0)
    controller.tick()

    promoted = store.latest_release("acme", "bot")
    assert promoted.state is S.PROMOTED
    assert promoted.hold_until == clock.now() + PLAN.window_s
    assert promoted.comparison is not None and promoted.comparison.passed
    assert registry.get_alias("acme", "bot").targets == (AliasTarget("v2", 1),)
    assert registry.get_revision("acme/bot@v2").state is RevisionState.STABLE
    assert _audited(registry) == [
        "release.start",
        "release.prewarming",
        "release.probing",
        "release.canary",
        "release.canary",
        "release.promoted",
    ]


@pytest.mark.parametrize("stored", [1e300, float("inf")])
def test_a_hold_stored_before_the_plan_bounds_ends_after_the_longest_window(
    registry: Registry, env: FakeEnv, clock: ManualClock, stored: float
) -> None:
    """A release stored before ``MAX_PLAN_SECONDS`` could carry a ``hold_until`` of 1e300 (its
    ``window_s``), or worse: on main its baseline stayed pinned for good and the release stayed
    in ``needing_work``. Now no hold outlives the longest window a plan may have now, from the
    release's last change."""
    store, controller = _to_canary(registry, env, clock)
    promoted = store.promote("acme", "bot", actor="ops")
    with registry.db.transaction() as tx:
        tx.execute(
            "UPDATE releases SET hold_until = ? WHERE release_id = ?",
            (stored, promoted.release_id),
        )
    clock.advance(1.0)
    controller.tick()
    assert env.pinned == {"v1"}  # held, within the longest window
    clock.advance(MAX_PLAN_SECONDS + 60.0)  # past the longest window after its last change
    controller.tick()
    assert env.pinned == set()
    assert store.latest_release("acme", "bot").hold_until is None


def test_the_old_revision_stays_held_for_the_window_then_is_unheld(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    store.promote("acme", "bot", actor="ops")
    promoted = store.latest_release("acme", "bot")
    assert promoted.hold_until is not None
    clock.advance(1.0)
    controller.tick()
    assert env.pinned == {"v1"}  # candidate's prewarm pin dropped; baseline held

    clock.advance(promoted.hold_until - clock.now() - 1.0)
    controller.tick()
    assert env.pinned == {"v1"}
    clock.advance(2.0)
    controller.tick()

    assert env.pinned == set()
    assert store.latest_release("acme", "bot").hold_until is None
    assert _audited(registry)[-1] == "release.unhold"


def test_a_rollback_of_a_promotion_keeps_the_promotions_hold(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    """docs/releases.md, *Delayed eviction*: a rollback of a promoted release keeps the hold its
    promotion set (seen on a live server: ``holding v1 until`` the same time before and after
    the rollback), where a rollback from canary holds the baseline ``window_s`` from then."""
    store, _ = _to_canary(registry, env, clock)
    promoted = store.promote("acme", "bot", actor="ops")
    assert promoted.hold_until == promoted.updated_at + PLAN.window_s
    rolled = store.rollback("acme", "bot", actor="ops")
    assert rolled.updated_at > promoted.updated_at  # the registry's clock moved on
    assert rolled.hold_until == promoted.hold_until


def test_a_rollback_from_canary_holds_the_baseline_for_the_window(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, _ = _to_canary(registry, env, clock)
    rolled = store.rollback("acme", "bot", actor="ops")
    assert rolled.hold_until == rolled.updated_at + PLAN.window_s


def test_a_failed_probe_rolls_back_before_any_canary_traffic(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    env.outputs[("v2", "hello")] = " goodbye"
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    controller = _controller(registry, env, clock)
    for _ in range(4):
        controller.tick()
        assert _served(registry, 50) == {"v1"}

    release = store.latest_release("acme", "bot")
    assert release.state is S.ROLLED_BACK
    assert release.reason is not None and "' goodbye'" in release.reason
    assert "release.canary" not in _audited(registry)
    assert env.window_since == []  # never judged live traffic: there was none


def test_an_extra_probe_must_differ_from_stable(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    env.outputs[("v1", "2+2=")] = "4"
    env.outputs[("v2", "2+2=")] = "4"
    plan = ReleasePlan(probes=(ProbeCase("2+2=", differ_from_stable=True),))
    release = _started_and_ticked(registry, env, clock, "v2", plan, ticks=3)
    assert release.state is S.ROLLED_BACK
    assert release.reason is not None and "the same as the stable revision" in release.reason
    assert ("v1", "2+2=") in env.probed


def test_a_load_failure_aborts_with_the_load_error(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    env.load_errors["v2"] = RuntimeError("adapter too large for the CPU tier")
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    controller = _controller(registry, env, clock)
    for _ in range(3):
        controller.tick()

    release = store.latest_release("acme", "bot")
    assert release.state is S.ABORTED
    assert release.reason == "candidate failed to load: adapter too large for the CPU tier"
    assert env.probed == []
    assert env.pinned == set()  # the abort releases the baseline hold at once


def test_an_error_rate_breach_rolls_back_before_the_dwell_ends(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    assert "v2" in _served(registry)
    env.windows = {"acme/bot@v2": RevisionWindow(requests=20, errors=5), "acme/bot@v1": HEALTHY}
    clock.advance(1.0)
    controller.tick()

    release = store.latest_release("acme", "bot")
    assert release.state is S.ROLLED_BACK
    assert release.reason is not None and "max_error_rate" in release.reason
    assert release.comparison is not None and release.comparison.candidate.errors == 5
    assert _served(registry) == {"v1"}  # the whole share is back on stable at once
    clock.advance(1.0)
    controller.tick()
    assert env.pinned == {"v1"}  # the candidate is unheld at once, the baseline kept


def test_too_few_requests_never_breach_nor_pass(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    env.windows = {"acme/bot@v2": RevisionWindow(requests=3, errors=3)}
    clock.advance(120.0)
    controller.tick()
    release = store.latest_release("acme", "bot")
    assert (release.state, release.step) == (S.CANARY, 0)
    assert release.comparison is not None and release.comparison.breaches == ()


def test_without_auto_promote_the_last_step_waits_for_an_operator(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    plan = ReleasePlan(ladder=(0.2,), dwell_s=10.0, auto_promote=False)
    store, controller = _to_canary(registry, env, clock, plan)
    env.windows = {"acme/bot@v2": HEALTHY, "acme/bot@v1": HEALTHY}
    clock.advance(11.0)
    controller.tick()
    waiting = store.latest_release("acme", "bot")
    assert waiting.state is S.CANARY
    assert waiting.comparison is not None and waiting.comparison.passed

    assert store.promote("acme", "bot", actor="ops").state is S.PROMOTED
    assert registry.resolve("acme", "bot").revision == "v2"


def test_a_restart_mid_canary_resumes_and_restarts_the_step_dwell(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, _ = _to_canary(registry, env, clock)
    env.windows = {"acme/bot@v2": HEALTHY, "acme/bot@v1": HEALTHY}
    clock.advance(50.0)
    fresh_env = FakeEnv(outputs=env.outputs, windows=env.windows)
    resumed = _controller(registry, fresh_env, clock)  # the old process is gone

    resumed.tick()
    release = store.latest_release("acme", "bot")
    assert (release.state, release.step, release.step_started_at) == (S.CANARY, 0, clock.now())
    assert fresh_env.pinned == {"v1", "v2"}  # holds and prewarm re-applied
    clock.advance(50.0)  # 100 s into the step overall, 50 s since the restart
    resumed.tick()
    assert store.latest_release("acme", "bot").step == 0
    clock.advance(11.0)
    resumed.tick()
    assert store.latest_release("acme", "bot").step == 1


def test_a_restart_during_probing_redoes_the_probes(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    first = _controller(registry, env, clock)
    first.tick()
    first.tick()
    assert store.latest_release("acme", "bot").state is S.PROBING

    fresh_env = FakeEnv(outputs=env.outputs)
    second = _controller(registry, fresh_env, clock)
    second.tick()
    assert store.latest_release("acme", "bot").state is S.CANARY
    assert fresh_env.prewarmed == [("v2", False)]
    assert fresh_env.probed == [("v2", "hello")]


def test_a_restart_after_promotion_holds_the_old_revision_again_until_the_window_ends(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, _ = _to_canary(registry, env, clock)
    hold_until = store.promote("acme", "bot", actor="ops").hold_until
    assert hold_until is not None
    fresh_env = FakeEnv()
    resumed = _controller(registry, fresh_env, clock)
    resumed.tick()
    assert fresh_env.pinned == {"v1"}
    clock.advance(hold_until - clock.now() + 1.0)
    resumed.tick()
    assert fresh_env.pinned == set()


def test_operator_and_controller_racing_one_wins_and_nothing_breaks(
    registry: Registry, env: FakeEnv, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, controller = _to_canary(registry, env, clock)
    seen = store.needing_work()  # what the controller read ...
    store.promote("acme", "bot", actor="ops")  # ... before the operator acted
    env.windows = {"acme/bot@v2": RevisionWindow(requests=20, errors=20)}

    with pytest.raises(ReleaseConflictError, match="moved to promoted"):
        store.transition(seen[0], S.ROLLED_BACK, actor="controller", now=clock.now())
    monkeypatch.setattr(controller.store, "needing_work", lambda: seen)
    controller.tick()  # the stale decision loses; tick does not raise

    release = store.latest_release("acme", "bot")
    assert release.state is S.PROMOTED
    assert _audited(registry).count("release.promoted") == 1
    assert "release.rolled_back" not in _audited(registry)
    assert registry.get_alias("acme", "bot").targets == (AliasTarget("v2", 1),)


def test_a_tick_never_raises_when_the_environment_fails(
    registry: Registry, env: FakeEnv, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, controller = _to_canary(registry, env, clock)

    def broken(*_: object) -> RevisionWindow:
        raise ConnectionError("metrics unavailable")

    monkeypatch.setattr(env, "window", broken)
    clock.advance(120.0)
    controller.tick()
    assert store.latest_release("acme", "bot").state is S.CANARY


def test_operator_rollback_of_a_canary_returns_all_traffic_to_stable(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    assert "v2" in _served(registry)
    rolled = store.rollback("acme", "bot", actor="ops")
    assert rolled.state is S.ROLLED_BACK
    assert rolled.reason == "rolled back by operator"
    assert _served(registry) == {"v1"}
    controller.tick()
    assert env.pinned == {"v1"}


def test_an_idle_tick_is_one_read_and_touches_nothing(
    registry: Registry, env: FakeEnv, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = _controller(registry, env, clock)
    opened: list[bool] = []
    real = registry.db.transaction

    def counting(write: bool = True):  # type: ignore[no-untyped-def]
        opened.append(write)
        return real(write)

    monkeypatch.setattr(registry.db, "transaction", counting)
    controller.tick()
    assert opened == [False]
    assert (env.prewarmed, env.pinned, env.window_since) == ([], set(), [])


def test_a_prewarm_that_raises_at_once_aborts_like_a_failed_load(
    registry: Registry, env: FakeEnv, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise MemoryError("no room in L1")

    monkeypatch.setattr(env, "prewarm", refuse)
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    controller = _controller(registry, env, clock)
    controller.tick()
    controller.tick()
    release = store.latest_release("acme", "bot")
    assert (release.state, release.reason) == (S.ABORTED, "candidate failed to load: no room in L1")


def test_a_step_starved_of_traffic_is_rolled_back_after_max_step_s(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    plan = ReleasePlan(ladder=(0.1,), dwell_s=60.0, thresholds=Thresholds(max_step_s=300.0))
    store, controller = _to_canary(registry, env, clock, plan)
    env.windows = {"acme/bot@v2": RevisionWindow(requests=3), "acme/bot@v1": HEALTHY}
    clock.advance(299.0)
    controller.tick()
    assert store.latest_release("acme", "bot").state is S.CANARY  # still waiting
    clock.advance(1.0)
    controller.tick()
    release = store.latest_release("acme", "bot")
    assert release.state is S.ROLLED_BACK
    assert release.reason == (
        "not enough traffic to judge: step 1 saw 3 counted candidate requests in 300 s "
        "(min_requests 10, max_step_s 300)"
    )
    assert _served(registry) == {"v1"}


def test_max_step_s_defaults_to_ten_dwells_or_an_hour() -> None:
    assert ReleasePlan(dwell_s=60.0).effective_max_step_s == 3600.0
    assert ReleasePlan(dwell_s=600.0).effective_max_step_s == 6000.0
    with pytest.raises(ValueError, match=r"max_step_s 30\.0 is invalid; expected >= dwell_s"):
        ReleasePlan(dwell_s=60.0, thresholds=Thresholds(max_step_s=30.0))
    with pytest.raises(ValueError, match="min_latency_samples 0 is invalid"):
        Thresholds(min_latency_samples=0)


def test_one_callers_failures_alone_do_not_roll_back(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    store, controller = _to_canary(registry, env, clock)
    # 12 failures, all from one tenant, beside 20 clean requests of others: not a breach.
    attacked = RevisionWindow(
        requests=32, errors=12, callers=21, top_caller_requests=12, top_caller_errors=12
    )
    env.windows = {"acme/bot@v2": attacked, "acme/bot@v1": HEALTHY}
    clock.advance(61.0)
    controller.tick()
    release = store.latest_release("acme", "bot")
    assert (release.state, release.step) == (S.CANARY, 1)  # judged on the other 20: passed
    spread = RevisionWindow(
        requests=32, errors=12, callers=12, top_caller_requests=2, top_caller_errors=2
    )
    env.windows = {"acme/bot@v2": spread, "acme/bot@v1": HEALTHY}
    clock.advance(1.0)
    controller.tick()
    rolled = store.latest_release("acme", "bot")
    assert rolled.state is S.ROLLED_BACK
    assert rolled.reason is not None and "error rate 0.333 > max_error_rate" in rolled.reason


def test_every_move_is_reported_to_on_move(
    registry: Registry, env: FakeEnv, clock: ManualClock
) -> None:
    env.outputs[("v2", "hello")] = " goodbye"  # the probe fails: rolled back
    ReleaseStore(registry).start_release("acme", "bot", "v2", PLAN, actor="ops")
    moves: list[ReleaseState] = []
    controller = ReleaseController(registry, env, clock, on_move=lambda *a: moves.append(a[0]))
    for _ in range(4):
        controller.tick()
    assert moves == [S.PREWARMING, S.PROBING, S.ROLLED_BACK]


@pytest.mark.parametrize("move", ["rollback", "promote"])
def test_an_operators_move_is_reported_to_on_move_once(
    registry: Registry, env: FakeEnv, clock: ManualClock, move: str
) -> None:
    """`loraplex release rollback` writes the registry, not through the server: only the
    controller's own moves reached ``on_move``, so ``loraplex_release_transitions_total{state=
    "rolled_back"}`` stayed 0 and LoraplexReleaseRolledBack never fired for it (newop4)."""
    store = ReleaseStore(registry)
    store.start_release("acme", "bot", "v2", PLAN, actor="ops")
    moves: list[tuple[object, ...]] = []
    controller = ReleaseController(registry, env, clock, on_move=lambda *a: moves.append(a))
    for _ in range(3):  # staged -> prewarming -> probing -> canary
        controller.tick()
    release_id = store.latest_release("acme", "bot").release_id
    assert [a[0] for a in moves] == [S.PREWARMING, S.PROBING, S.CANARY]
    moved = getattr(store, move)("acme", "bot", actor="cli:ops")  # as the CLI does
    for _ in range(3):
        clock.advance(1.0)
        controller.tick()
    assert moves[3:] == [(moved.state, release_id)]


def test_a_candidate_whose_stored_probe_is_invalid_is_aborted_not_stuck(
    registry: Registry, env: FakeEnv, clock: ManualClock, base: BaseModelSpec, tmp_path: Path
) -> None:
    """A revision registered before registration bounded its probe texts may hold an empty
    probe prompt; its release stayed in probing for good (each tick raised), both revisions
    pinned."""
    adapter_dir = write_adapter(tmp_path / "adapters" / "v4", base, seed=4)
    request = RegistrationRequest(
        adapter_dir, "acme", "bot", "v4", probe_prompt="x", expected_continuation="y"
    )
    object.__setattr__(request, "probe_prompt", "")  # as an older registry stored it
    registry.register(request, "ops")
    release = _started_and_ticked(registry, env, clock, "v4", PLAN, ticks=4)
    assert release.state is S.ABORTED
    assert release.reason is not None and "probe is invalid" in release.reason
    assert env.pinned == set()
    assert _served(registry, 50) == {"v1"}


OVER_BOUNDS = [
    (ReleasePlan(probes=(ProbeCase("p", "x"),) * 33), "probes: 33 is invalid"),
    (ReleasePlan(probes=(ProbeCase("p" * 4097, "x"),)), "prompt of 4097 characters"),
    (ReleasePlan(probes=(ProbeCase("p", "x" * 4097),)), "expected of 4097 characters"),
    (ReleasePlan(probes=(ProbeCase("p", "x", max_tokens=100_000),)), "max_tokens 100000"),
    (ReleasePlan(probes=(ProbeCase("p", "x", max_tokens=True),)), "max_tokens True"),
    (ReleasePlan(probes=(ProbeCase(5, "x"),)), "prompt 5 is invalid"),  # type: ignore[arg-type]
    (ReleasePlan(ladder=tuple((i + 1) / 20 for i in range(17))), "ladder of 17 steps"),
    (ReleasePlan(probes=(ProbeCase("p", "x\ud800"),)), r"expected '\\ud800' at character 1"),
    (ReleasePlan(window_s=float("inf")), "window_s inf is invalid; expected at most 2592000 s"),
    (ReleasePlan(dwell_s=1e300), "dwell_s 1e\\+300 is invalid"),
    (ReleasePlan(thresholds=Thresholds(max_step_s=2592001.0)), "max_step_s 2592001.0"),
]


@pytest.mark.parametrize(("plan", "named"), OVER_BOUNDS)
def test_a_plan_over_the_bounds_is_refused_at_start(
    registry: Registry, plan: ReleasePlan, named: str
) -> None:
    """attack27: only the admin API's body bounded a plan (16 steps, 32 probes of 4096
    characters and 256 tokens); ``release start --probe-file`` and ``start_release`` took 3,000
    probes of 100,000 tokens each, all launched on the engine at once."""
    store = ReleaseStore(registry)
    with pytest.raises(ReleaseStartError, match=named):
        store.start_release("acme", "bot", "v2", plan, actor="ops")
    assert store.list_releases(include_terminal=True) == []


def test_a_stored_plan_over_the_bounds_is_aborted_before_any_probe_runs(
    registry: Registry, env: FakeEnv, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan stored before the bounds held (as an older ``release start`` wrote it) runs no
    probe: the release is aborted naming the bound, and its pins go."""
    monkeypatch.setattr("loraplex.release.store.check_plan_bounds", lambda *bounds: None)
    plan = ReleasePlan(probes=(ProbeCase("2+2=", "4", max_tokens=100_000),) * 40)
    release = _started_and_ticked(registry, env, clock, "v2", plan, ticks=4)
    assert release.state is S.ABORTED
    assert release.reason is not None and "probes: 40 is invalid" in release.reason
    assert env.probed == []
    assert env.pinned == set()


def test_a_move_counted_by_the_admin_route_is_not_counted_again_by_the_controller() -> None:
    """The admin API's rollback counts its move, and the controller then sees it too."""
    traffic = ReleaseTraffic(ManualClock(), lambda: [])
    traffic.count_transition("rolled_back", "rel-1")  # the route
    traffic.count_transition("rolled_back", "rel-1")  # the controller, a tick later
    traffic.count_transition("rolled_back", "rel-2")
    traffic.count_transition("canary")  # no id: counted each time, as before
    traffic.count_transition("canary")
    assert traffic.transitions() == {"rolled_back": 2, "canary": 2}
