"""The watchdog's verdicts (clock-free): an idle engine is never hung, work pending without
progress for the bound is, progress clears it, and the kill comes once, a bound later; an engine
process silent (no sign of life) past the liveness bound is hung at once, a beat clears that
(and only that), and its frozen time is not missing progress; a judge late by its own
scheduling does not count its delay as the process's silence."""

from __future__ import annotations

import pytest

from loraplex.engine.watchdog import Cause, ProgressWatchdog, Verdict, WatchdogPolicy

POLICY = WatchdogPolicy(hung_after_s=10.0, kill_after_s=20.0, unresponsive_after_s=0.5)


def _progress_only(now_s: float = 0.0) -> ProgressWatchdog:
    """The progress rule alone (an engine thread's watchdog: no liveness signal)."""
    return ProgressWatchdog(POLICY, now_s, liveness=False)


def test_an_idle_engine_is_never_hung_however_long_it_is_quiet() -> None:
    dog = _progress_only()
    assert [dog.check(t, pending=False) for t in (5.0, 50.0, 5000.0)] == [Verdict.OK] * 3
    assert not dog.hung


def test_work_pending_is_measured_from_when_it_arrived_not_from_the_last_progress() -> None:
    dog = _progress_only()
    assert dog.check(1000.0, pending=True) is Verdict.OK  # quiet for long, but idle until now
    assert dog.check(1009.9, pending=True) is Verdict.OK  # below the bound: a long forward
    assert dog.check(1010.0, pending=True) is Verdict.HUNG
    assert dog.hung


def test_progress_below_the_bound_keeps_it_ok_and_progress_clears_a_hang() -> None:
    dog = _progress_only()
    for t in range(0, 100, 9):  # a step every 9 s, under the 10 s bound
        dog.progress(float(t))
        assert dog.check(t + 8.9, pending=True) is Verdict.OK
    assert dog.check(200.0, pending=True) is Verdict.HUNG
    assert dog.check(201.0, pending=False) is Verdict.HUNG  # its requests gave up: still hung
    dog.progress(202.0)
    assert dog.check(202.0, pending=True) is Verdict.OK and not dog.hung


def test_the_kill_comes_once_a_bound_after_the_hang() -> None:
    dog = _progress_only()
    dog.check(0.0, pending=True)
    assert dog.check(10.0, pending=True) is Verdict.HUNG
    assert dog.check(29.9, pending=True) is Verdict.HUNG
    assert dog.check(30.0, pending=True) is Verdict.KILL
    assert dog.check(31.0, pending=True) is Verdict.HUNG  # killed already: no second kill
    dog.progress(40.0)  # the restarted engine
    dog.check(40.0, pending=True)
    assert dog.check(50.0, pending=True) is Verdict.HUNG
    assert dog.check(70.0, pending=True) is Verdict.KILL


def test_heartbeats_come_several_times_per_bound() -> None:
    assert WatchdogPolicy(hung_after_s=1.0).beat_interval_s < 0.5
    assert WatchdogPolicy(unresponsive_after_s=0.5).alive_interval_s <= 0.1


def test_a_silent_process_with_work_pending_is_hung_after_the_liveness_bound() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
    assert dog.check(100.0, pending=False) is Verdict.OK  # idle and silent: never hung
    assert dog.check(100.0, pending=True) is Verdict.OK  # silence counted from the work's arrival
    assert dog.check(100.4, pending=True) is Verdict.OK
    assert dog.check(100.5, pending=True) is Verdict.HUNG
    assert dog.cause is Cause.UNRESPONSIVE


def test_beats_keep_a_process_in_a_long_forward_ok_until_the_progress_bound() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
    dog.check(0.0, pending=True)
    for tenth in range(1, 99):  # beats every 0.1 s, no progress for 9.8 s: a long forward
        dog.alive(tenth / 10)
        assert dog.check(tenth / 10 + 0.05, pending=True) is Verdict.OK
    dog.alive(10.0)
    assert dog.check(10.0, pending=True) is Verdict.HUNG  # a wedged loop that still beats
    assert dog.cause is Cause.NO_PROGRESS
    dog.alive(10.1)  # a beat does not clear a hang of no progress
    assert dog.check(10.1, pending=True) is Verdict.HUNG
    dog.progress(10.2)
    assert dog.check(10.2, pending=True) is Verdict.OK and dog.cause is None


def test_a_beat_after_a_freeze_clears_it_and_the_frozen_time_is_not_missing_progress() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
    dog.check(0.0, pending=True)
    assert dog.check(0.6, pending=True) is Verdict.HUNG  # frozen from 0.0
    assert dog.check(15.0, pending=True) is Verdict.HUNG  # 15 s: past the progress bound too
    dog.alive(15.0)  # continued: the loop has not stepped yet, but it just got the CPU back
    assert dog.check(15.01, pending=True) is Verdict.OK and not dog.hung
    assert dog.check(24.9, pending=True) is Verdict.HUNG  # silent again (no beat since 15.0)
    dog.alive(24.95)
    assert dog.check(24.95, pending=True) is Verdict.OK  # progress clock restarted at 24.95


def test_a_process_frozen_past_the_kill_bound_is_killed_once() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
    dog.check(0.0, pending=True)
    assert dog.check(0.5, pending=True) is Verdict.HUNG
    assert dog.check(20.4, pending=False) is Verdict.HUNG  # its requests failed: still hung
    assert dog.check(20.5, pending=False) is Verdict.KILL
    assert dog.check(20.6, pending=False) is Verdict.HUNG


TICK_S = 0.125  # how often the process transport's IO thread judges (unresponsive_after_s / 4)


def _judged(now_s: float = 0.0) -> ProgressWatchdog:
    """A process engine's watchdog as its IO thread runs it: checked every ``TICK_S``."""
    return ProgressWatchdog(POLICY, now_s, judge_every_s=TICK_S)


def _on_time(dog: ProgressWatchdog, start_s: float, num_checks: int) -> list[Verdict]:
    return [dog.check(start_s + i * TICK_S, pending=True) for i in range(1, num_checks + 1)]


def test_a_frozen_process_is_hung_within_the_bound_while_the_judge_runs_on_time() -> None:
    dog = _judged()
    dog.check(0.0, pending=True)
    assert _on_time(dog, 0.0, 4) == [Verdict.OK] * 3 + [Verdict.HUNG]  # silent 0.5 s: frozen
    assert dog.cause is Cause.UNRESPONSIVE


def test_a_judge_late_by_its_own_scheduling_does_not_count_its_delay_as_silence() -> None:
    """An overloaded machine: the judge's thread got the CPU 0.9 s late, and the beats the
    engine sent meanwhile are still in the pipe. Without the discount this was a hang (the
    second assert fails with ``judge_every_s=None``); the beats read next clear the silence."""
    dog = _judged()
    dog.check(0.0, pending=True)
    assert dog.check(0.9, pending=True) is Verdict.OK and not dog.hung
    dog.alive(0.9)  # the beats waiting in the pipe
    assert _on_time(dog, 0.9, 3) == [Verdict.OK] * 3
    late = ProgressWatchdog(POLICY, 0.0)  # the same, counting every gap whole
    late.check(0.0, pending=True)
    assert late.check(0.9, pending=True) is Verdict.HUNG


def test_a_frozen_process_is_still_found_by_a_judge_that_was_late_once() -> None:
    dog = _judged()
    dog.check(0.0, pending=True)
    assert dog.check(3.0, pending=True) is Verdict.OK  # late: counts 2 ticks of silence
    assert _on_time(dog, 3.0, 2) == [Verdict.OK, Verdict.HUNG]  # 0.25 s more on time: frozen
    dog.alive(3.5)
    assert dog.check(3.5, pending=True) is Verdict.OK and not dog.hung


def test_a_judge_late_on_every_check_still_finds_a_frozen_process() -> None:
    dog = _judged()
    dog.check(0.0, pending=True)
    verdicts = [dog.check(t, pending=True) for t in (1.0, 2.0)]  # 0.25 s counted per check
    assert verdicts == [Verdict.OK, Verdict.HUNG]


def test_the_judge_interval_is_checked() -> None:
    with pytest.raises(ValueError, match=r"^judge_every_s 0 is invalid; expected > 0$"):
        ProgressWatchdog(POLICY, 0.0, judge_every_s=0)


@pytest.mark.parametrize("field", ["hung_after_s", "kill_after_s", "unresponsive_after_s"])
def test_a_bad_watchdog_policy_is_refused_naming_its_field(field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} 0 is invalid; expected > 0$"):
        WatchdogPolicy(**{field: 0})


def test_silence_while_the_process_is_runnable_is_the_machines_load_not_a_freeze() -> None:
    """A starved engine process (a thread of it waiting in the run queue) is silent as long as a
    stopped one; only the stopped one's silence counts."""
    starved, stopped = _judged(), _judged()
    for dog in (starved, stopped):
        dog.check(0.0, pending=True)
    on_time = [TICK_S * i for i in range(1, 9)]  # 1 s of on-time checks, no beat
    assert [starved.check(t, pending=True, runnable=True) for t in on_time] == [Verdict.OK] * 8
    assert starved.silence_s == 0.0
    assert _on_time(stopped, 0.0, 4)[-1] is Verdict.HUNG  # silent 0.5 s, not runnable
    # runnable for a while, then not (stopped while starved): its silence counts from then
    assert starved.check(1.125, pending=True) is Verdict.OK
    assert _on_time(starved, 1.125, 3) == [Verdict.OK, Verdict.OK, Verdict.HUNG]
