"""Whether an engine that is alive still makes progress: a clock-free progress watchdog.

A stopped or wedged engine (SIGSTOP, a deadlock, a device that never returns) keeps its process
and its pipe: nothing dies, so supervision by exit alone never notices, and every request waits
on it. The engine loop therefore reports progress (every step, and a heartbeat at least every
``beat_interval_s`` while it loops, idle or not), and the watchdog reads the gaps:

- no progress for ``hung_after_s`` while work is pending (a live stream or call): **hung**. Work
  that became pending only recently is measured from when it did, so an engine idle for an hour
  is not hung the moment a request arrives; an engine with nothing pending is never hung;
- hung stays hung until progress is seen again (then it has recovered), so the verdict does not
  flap when the requests stuck in it give up;
- hung for ``kill_after_s`` more: **kill** (the supervisor kills it and restarts it).

``hung_after_s`` is a bound, not a guess: one forward longer than it is declared hung too. A slow
adapter load is not (the engine loop turns while a request waits for its adapter).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_HUNG_AFTER_S = 10.0
DEFAULT_KILL_AFTER_S = 20.0
# Heartbeats per hung_after_s: a healthy engine's gap between two reports stays well inside it.
_BEATS_PER_BOUND = 4


@dataclass(frozen=True)
class WatchdogPolicy:
    """When an engine without progress is declared hung, and when it is killed."""

    hung_after_s: float = DEFAULT_HUNG_AFTER_S  # no progress this long, work pending: hung
    kill_after_s: float = DEFAULT_KILL_AFTER_S  # hung this much longer: killed and restarted

    def __post_init__(self) -> None:
        for name in ("hung_after_s", "kill_after_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")

    @property
    def beat_interval_s(self) -> float:
        """How often a looping engine reports progress when it has nothing else to report."""
        return self.hung_after_s / _BEATS_PER_BOUND


class Verdict(enum.Enum):
    OK = "ok"  # progressing, or nothing pending
    HUNG = "hung"  # refuse new work; wait for progress (or the kill bound)
    KILL = "kill"  # hung past the kill bound: kill it (answered once per hang)


class ProgressWatchdog:
    """The verdict on one engine from its progress reports (times are passed in)."""

    def __init__(self, policy: WatchdogPolicy, now_s: float) -> None:
        self.policy = policy
        self._progress_s = now_s  # the last progress report (or the start)
        self._pending_since_s: float | None = None  # work pending since; None: none pending
        self._hung_since_s: float | None = None  # declared hung at; None: not hung
        self._killed = False  # KILL was answered (once per hang)

    @property
    def hung(self) -> bool:
        return self._hung_since_s is not None

    def progress(self, now_s: float) -> None:
        """The engine reported progress: whatever it was, it is not hung now."""
        self._progress_s = now_s
        self._hung_since_s = None
        self._killed = False

    def check(self, now_s: float, pending: bool) -> Verdict:
        """The verdict at ``now_s``; ``pending``: work is waiting on the engine."""
        if not pending:
            self._pending_since_s = None
        elif self._pending_since_s is None:
            self._pending_since_s = now_s
        if self._hung_since_s is None:
            if self._pending_since_s is None:
                return Verdict.OK
            quiet_since_s = max(self._progress_s, self._pending_since_s)
            if now_s - quiet_since_s < self.policy.hung_after_s:
                return Verdict.OK
            self._hung_since_s = now_s
        if not self._killed and now_s - self._hung_since_s >= self.policy.kill_after_s:
            self._killed = True
            return Verdict.KILL
        return Verdict.HUNG

    def quiet_s(self, now_s: float) -> float:
        """Seconds since the last progress report."""
        return now_s - self._progress_s
