"""The progress watchdog's verdicts (clock-free): an idle engine is never hung, work pending
without progress for the bound is, progress clears it, and the kill comes once, a bound later."""

from __future__ import annotations

import pytest

from loraplex.engine.watchdog import ProgressWatchdog, Verdict, WatchdogPolicy

POLICY = WatchdogPolicy(hung_after_s=10.0, kill_after_s=20.0)


def test_an_idle_engine_is_never_hung_however_long_it_is_quiet() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
    assert [dog.check(t, pending=False) for t in (5.0, 50.0, 5000.0)] == [Verdict.OK] * 3
    assert not dog.hung


def test_work_pending_is_measured_from_when_it_arrived_not_from_the_last_progress() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
    assert dog.check(1000.0, pending=True) is Verdict.OK  # quiet for long, but idle until now
    assert dog.check(1009.9, pending=True) is Verdict.OK  # below the bound: a long forward
    assert dog.check(1010.0, pending=True) is Verdict.HUNG
    assert dog.hung


def test_progress_below_the_bound_keeps_it_ok_and_progress_clears_a_hang() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
    for t in range(0, 100, 9):  # a step every 9 s, under the 10 s bound
        dog.progress(float(t))
        assert dog.check(t + 8.9, pending=True) is Verdict.OK
    assert dog.check(200.0, pending=True) is Verdict.HUNG
    assert dog.check(201.0, pending=False) is Verdict.HUNG  # its requests gave up: still hung
    dog.progress(202.0)
    assert dog.check(202.0, pending=True) is Verdict.OK and not dog.hung


def test_the_kill_comes_once_a_bound_after_the_hang() -> None:
    dog = ProgressWatchdog(POLICY, now_s=0.0)
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


@pytest.mark.parametrize("field", ["hung_after_s", "kill_after_s"])
def test_a_bad_watchdog_policy_is_refused_naming_its_field(field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} 0 is invalid; expected > 0$"):
        WatchdogPolicy(**{field: 0})
