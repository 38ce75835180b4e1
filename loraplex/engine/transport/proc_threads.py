"""Whether a process's threads run or wait for a CPU, as Linux's ``/proc`` says.

The engine watchdog's liveness rule declares a silent engine process frozen (SIGSTOP, a
debugger). On an overloaded machine a process that is only starved goes silent too; unlike a
stopped one, some thread of it is runnable (state ``R``: on a CPU or waiting in the run queue),
while a stopped process's threads are all ``T`` (``t`` under a debugger). The watchdog reads this
to tell the two apart (``ProgressWatchdog.check``'s ``runnable``).
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def thread_states(pid: int, proc: Path = PROC) -> list[str]:
    """The state letter of each thread of ``pid`` (empty once it exited, or without ``/proc``)."""
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return []
    states = []
    for task in tasks:
        try:
            stat = (task / "stat").read_bytes()
        except OSError:
            continue  # the thread ended meanwhile
        # "tid (comm) state ...": comm may hold spaces and ")", so read after the last ")".
        states.append(chr(stat[stat.rindex(b")") + 2]))
    return states


def any_thread_runnable(pid: int, proc: Path = PROC) -> bool:
    """Whether some thread of ``pid`` is running or runnable (state ``R``)."""
    return "R" in thread_states(pid, proc)
