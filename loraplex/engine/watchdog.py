"""Whether an engine that is alive still makes progress: a clock-free progress watchdog.

A stopped or wedged engine (SIGSTOP, a deadlock, a device that never returns) keeps its process
and its pipe: nothing dies, so supervision by exit alone never notices, and every request waits
on it. The watchdog reads two signals, and both only while work is pending (a live stream or
call): an engine with nothing pending is never hung, and work that became pending only recently
is measured from when it did, so an engine idle for an hour is not hung the moment a request
arrives.

- **Liveness**: an engine process beats from a thread of its own every ``alive_interval_s``
  (``child_loop``), whatever its engine loop does; torch releases the interpreter lock inside
  its operations, so the beats go on during a long forward. Silence for ``unresponsive_after_s``
  means the whole process is frozen (SIGSTOP, a stalled VM, a debugger): **hung** at once. Any
  message from the process counts as a beat. Only silence the judge saw while it ran on time
  counts (``judge_every_s``): on an overloaded machine the judge's own thread waits for the CPU
  too, and the beats sent meanwhile sit unread in the pipe; a gap between two checks longer than
  ``_ON_TIME_CHECKS`` judge intervals counts as that long, not as the whole gap. A frozen
  process is one whose beats stop while the judge itself runs on time (measured on a loaded
  ``qualify`` run: 15 false 503s from the wall-clock silence). Nor does silence while the
  process was seen runnable (``check``'s ``runnable``: a thread of it on a CPU or waiting for
  one, read from ``/proc``): that process is starved by the machine's load, not stopped; a
  stopped process's threads are never runnable. A process busy but silent for long (a loop that
  holds the interpreter lock) is left to the progress rule.
- **Progress**: the engine loop reports every step and a heartbeat at least every
  ``beat_interval_s`` while it loops. No progress for ``hung_after_s``: **hung** (a wedged loop
  that still beats). This bound is not a guess: one forward longer than it is declared hung too;
  a slow adapter load is not (the engine loop turns while a request waits for its adapter).

Hung stays hung until the signal that was missing is seen again (then it has recovered), so the
verdict does not flap when the requests stuck in it give up. A process that beats again after a
freeze is not charged the frozen time as missing progress: its progress clock restarts then.
Hung for ``kill_after_s`` more: **kill** (the supervisor kills it and restarts it).

An engine on a thread of the server process (``thread_client``) has no liveness signal of its
own (a frozen process freezes its watcher too); it is watched for progress only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_HUNG_AFTER_S = 10.0
DEFAULT_KILL_AFTER_S = 20.0
DEFAULT_UNRESPONSIVE_AFTER_S = 0.5
# Heartbeats per hung_after_s: a healthy engine's gap between two reports stays well inside it.
_BEATS_PER_BOUND = 4
# Liveness beats per unresponsive_after_s: a few late beats on a busy machine are not a freeze.
_ALIVE_BEATS_PER_BOUND = 5
# A gap between two checks up to this many judge intervals is the judge on time (a check waits
# out a tick, and one that a message cut short waits for the next); past it, the judge was late.
_ON_TIME_CHECKS = 2


@dataclass(frozen=True)
class WatchdogPolicy:
    """When an engine without progress is declared hung, and when it is killed."""

    hung_after_s: float = DEFAULT_HUNG_AFTER_S  # no progress this long, work pending: hung
    kill_after_s: float = DEFAULT_KILL_AFTER_S  # hung this much longer: killed and restarted
    # an engine process silent this long (no beat, no message), work pending: frozen, hung
    unresponsive_after_s: float = DEFAULT_UNRESPONSIVE_AFTER_S

    def __post_init__(self) -> None:
        for name in ("hung_after_s", "kill_after_s", "unresponsive_after_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")

    @property
    def beat_interval_s(self) -> float:
        """How often a looping engine reports progress when it has nothing else to report."""
        return self.hung_after_s / _BEATS_PER_BOUND

    @property
    def alive_interval_s(self) -> float:
        """How often an engine process's liveness thread beats."""
        return self.unresponsive_after_s / _ALIVE_BEATS_PER_BOUND


class Verdict(enum.Enum):
    OK = "ok"  # progressing, or nothing pending
    HUNG = "hung"  # refuse new work; wait for progress (or the kill bound)
    KILL = "kill"  # hung past the kill bound: kill it (answered once per hang)


class Cause(enum.Enum):
    """Why an engine was declared hung."""

    UNRESPONSIVE = "unresponsive"  # its process was silent: frozen
    NO_PROGRESS = "no progress"  # its process beat, but its engine loop made no progress


class ProgressWatchdog:
    """The verdict on one engine from its progress and liveness reports (times are passed in).

    ``liveness=False``: no liveness reports come (an engine thread); only progress is read.
    ``judge_every_s``: how often the caller checks; a longer gap between checks is the judge's
    own delay, counted as silence only up to ``_ON_TIME_CHECKS`` intervals (None: every gap
    counts whole)."""

    def __init__(
        self,
        policy: WatchdogPolicy,
        now_s: float,
        *,
        liveness: bool = True,
        judge_every_s: float | None = None,
    ) -> None:
        if judge_every_s is not None and not judge_every_s > 0:
            raise ValueError(f"judge_every_s {judge_every_s} is invalid; expected > 0")
        self.policy = policy
        self._liveness = liveness
        self._max_gap_s = None if judge_every_s is None else _ON_TIME_CHECKS * judge_every_s
        self._checked_s = now_s  # the last check (or the start)
        self._silence_s = 0.0  # silence seen on time since the last sign of life, work pending
        self._progress_s = now_s  # the last progress report (or the start)
        self._alive_s = now_s  # the last sign of life (or the start)
        self._pending_since_s: float | None = None  # work pending since; None: none pending
        self._hung_since_s: float | None = None  # declared hung at; None: not hung
        self.cause: Cause | None = None  # why it is hung; None: not hung
        self._killed = False  # KILL was answered (once per hang)

    @property
    def hung(self) -> bool:
        return self._hung_since_s is not None

    def progress(self, now_s: float) -> None:
        """The engine reported progress: whatever it was, it is not hung now."""
        self.alive(now_s)
        self._progress_s = now_s
        self._clear()

    def alive(self, now_s: float) -> None:
        """The engine process gave a sign of life (a beat or any message). After a silence past
        the liveness bound, the frozen time is not missing progress: that clock restarts."""
        if now_s - self._alive_s >= self.policy.unresponsive_after_s:
            self._progress_s = max(self._progress_s, now_s)
        self._alive_s = now_s
        self._silence_s = 0.0
        if self.cause is Cause.UNRESPONSIVE:
            self._clear()

    def _clear(self) -> None:
        self._hung_since_s = None
        self.cause = None
        self._killed = False

    def check(self, now_s: float, pending: bool, *, runnable: bool = False) -> Verdict:
        """The verdict at ``now_s``; ``pending``: work is waiting on the engine; ``runnable``:
        its process was seen running or waiting for a CPU just now (the silence since the last
        check is then the machine's load, not a freeze, and is not counted)."""
        if not pending:
            self._pending_since_s = None
            self._silence_s = 0.0
        elif self._pending_since_s is None:
            self._pending_since_s = now_s
        if runnable:
            self._checked_s = max(self._checked_s, now_s)
        self._observe_silence(now_s)
        if self._hung_since_s is None:
            self.cause = self._cause(now_s)
            if self.cause is None:
                return Verdict.OK
            self._hung_since_s = now_s
        if not self._killed and now_s - self._hung_since_s >= self.policy.kill_after_s:
            self._killed = True
            return Verdict.KILL
        return Verdict.HUNG

    def _observe_silence(self, now_s: float) -> None:
        """Adds the silence since the last check, sign of life or arrival of work (whichever
        came last), up to ``_max_gap_s``: beyond it the judge itself was late."""
        if self._pending_since_s is not None:
            gap_s = now_s - max(self._checked_s, self._alive_s, self._pending_since_s)
            if self._max_gap_s is not None:
                gap_s = min(gap_s, self._max_gap_s)
            self._silence_s += max(0.0, gap_s)
        self._checked_s = max(self._checked_s, now_s)

    def _cause(self, now_s: float) -> Cause | None:
        """Why the engine is hung at ``now_s`` (None: it is not), work pending or not."""
        if self._pending_since_s is None:
            return None
        if self._liveness and self._silence_s >= self.policy.unresponsive_after_s:
            return Cause.UNRESPONSIVE
        quiet_since_s = max(self._progress_s, self._pending_since_s)
        if now_s - quiet_since_s >= self.policy.hung_after_s:
            return Cause.NO_PROGRESS
        return None

    def quiet_s(self, now_s: float) -> float:
        """Seconds since the last progress report."""
        return now_s - self._progress_s

    @property
    def silence_s(self) -> float:
        """Silence counted toward the liveness bound (seen on time, the process not runnable)."""
        return self._silence_s

    def silent_s(self, now_s: float) -> float:
        """Seconds since the last sign of life."""
        return now_s - self._alive_s
