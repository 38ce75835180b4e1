"""Whether an engine that is alive still makes progress: a clock-free progress watchdog.

A stopped or wedged engine (SIGSTOP, a deadlock, a device that never returns) keeps its process
and its pipe: nothing dies, so supervision by exit alone never notices, and every request waits
on it. The watchdog reads two signals, and both only while work is pending (a live stream or
call): an engine with nothing pending is never hung, and work that became pending only recently
is measured from when it did, so an engine idle for an hour is not hung the moment a request
arrives.

- **Liveness**: an engine process beats from a thread of its own every ``alive_interval_s``
  (``process_child``), whatever its engine loop does; torch releases the interpreter lock inside
  its operations, so the beats go on during a long forward. Silence for ``unresponsive_after_s``
  means the whole process is frozen (SIGSTOP, a stalled VM, a debugger): **hung** at once. Any
  message from the process counts as a beat.
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

    ``liveness=False``: no liveness reports come (an engine thread); only progress is read."""

    def __init__(self, policy: WatchdogPolicy, now_s: float, *, liveness: bool = True) -> None:
        self.policy = policy
        self._liveness = liveness
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
        if self.cause is Cause.UNRESPONSIVE:
            self._clear()

    def _clear(self) -> None:
        self._hung_since_s = None
        self.cause = None
        self._killed = False

    def check(self, now_s: float, pending: bool) -> Verdict:
        """The verdict at ``now_s``; ``pending``: work is waiting on the engine."""
        if not pending:
            self._pending_since_s = None
        elif self._pending_since_s is None:
            self._pending_since_s = now_s
        if self._hung_since_s is None:
            self.cause = self._cause(now_s)
            if self.cause is None:
                return Verdict.OK
            self._hung_since_s = now_s
        if not self._killed and now_s - self._hung_since_s >= self.policy.kill_after_s:
            self._killed = True
            return Verdict.KILL
        return Verdict.HUNG

    def _cause(self, now_s: float) -> Cause | None:
        """Why the engine is hung at ``now_s`` (None: it is not), work pending or not."""
        if self._pending_since_s is None:
            return None
        if self._liveness:
            silent_since_s = max(self._alive_s, self._pending_since_s)
            if now_s - silent_since_s >= self.policy.unresponsive_after_s:
                return Cause.UNRESPONSIVE
        quiet_since_s = max(self._progress_s, self._pending_since_s)
        if now_s - quiet_since_s >= self.policy.hung_after_s:
            return Cause.NO_PROGRESS
        return None

    def quiet_s(self, now_s: float) -> float:
        """Seconds since the last progress report."""
        return now_s - self._progress_s

    def silent_s(self, now_s: float) -> float:
        """Seconds since the last sign of life."""
        return now_s - self._alive_s
