"""A server's process tree as Linux's ``/proc`` shows it: its descendants, their resident memory
and CPU time, and its engine child (``bench serve``'s hung-engine and stuck-stream attacks).

Read from ``/proc`` directly (what psutil reads on Linux) rather than through psutil, which is
not a dependency of the package. Elsewhere these raise ``RuntimeError``: the attacks that need
them then stop the benchmark instead of reporting a number they could not measure.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
# The command line of a multiprocessing "spawn" child: the server's engine runs in one, unless it
# was forked (``loraplex serve``'s first engine process): then its name says it.
SPAWN_MARKER = b"spawn_main"
ENGINE_NAME = b"loraplex-engine"  # engine.transport.process_child.ENGINE_PROCESS_NAME


def _require_proc() -> None:
    if not (PROC / "self" / "stat").exists():
        raise RuntimeError("the process tree needs Linux /proc; expected /proc/self/stat")


def parent_of(pid: int) -> int | None:
    """``pid``'s parent process id; None once it has exited."""
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and ")", so split after the last ")".
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def children_of(pid: int) -> list[int]:
    """The live direct children of ``pid``, ascending."""
    _require_proc()
    pids = [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]
    return sorted(child for child in pids if parent_of(child) == pid)


def descendants_of(pid: int) -> list[int]:
    """``pid``'s live children, their children, and so on."""
    found, pending = [], children_of(pid)
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(children_of(child))
    return sorted(found)


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 once it has exited)."""
    try:
        statm = (PROC / str(pid) / "statm").read_text(encoding="ascii")
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and every descendant, summed."""
    _require_proc()
    return sum(rss_bytes(p) for p in (pid, *descendants_of(pid)))


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) one process has used (0 once it has exited)."""
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    fields = stat[stat.rindex(b")") + 2 :].split()  # fields from the 3rd (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant, summed (an exited one's are lost)."""
    _require_proc()
    return sum(cpu_s(p) for p in (pid, *descendants_of(pid)))


def engine_child(server_pid: int) -> int:
    """The server's engine process: its one child named as the engine, or started by
    multiprocessing's spawn (the resource tracker, another child, is neither). RuntimeError when
    there is not exactly one."""
    engines = []
    for child in children_of(server_pid):
        try:
            command = (PROC / str(child) / "cmdline").read_bytes()
            name = (PROC / str(child) / "comm").read_bytes().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if name == ENGINE_NAME or SPAWN_MARKER in command:
            engines.append(child)
    if len(engines) != 1:
        raise RuntimeError(
            f"server process {server_pid} has {len(engines)} engine children {engines}; "
            "expected exactly one engine process (engine_process = true)"
        )
    return engines[0]
