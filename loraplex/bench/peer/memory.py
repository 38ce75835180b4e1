"""Resident memory of a benchmarked server's whole process tree, sampled while it runs.

The tree is every descendant of this (the benchmark's) process: a server runs as a child, with
its own children (loraplex's engine process; vLLM's engine core and worker), and only one server
runs at a time. Linux only (``/proc``); elsewhere the figure is None, never 0.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

SAMPLE_PERIOD_S = 0.2  # a shorter spike between two samples is missed (a lower bound)
PROC = Path("/proc")


def parent_map(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid of every process ``proc`` lists (those that vanish meanwhile skipped)."""
    parents = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat.rpartition(")")[2].split()
        if len(fields) >= 2 and fields[1].isdigit():
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """Every process below ``root`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return sorted(found)


def rss_bytes(pid: int, proc: Path = PROC) -> int:
    """VmRSS of ``pid``; 0 once it has exited (or for a kernel thread without one)."""
    try:
        lines = (proc / str(pid) / "status").read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # reported in kB
    return 0


def tree_rss_bytes(root: int, proc: Path = PROC) -> int:
    """Summed VmRSS of every descendant of ``root`` now."""
    return sum(rss_bytes(pid, proc) for pid in descendants(root, parent_map(proc)))


class RssSampler:
    """``with RssSampler() as rss:`` samples this process's descendants' summed RSS on a thread
    until the block ends; ``peak_bytes`` is the largest sample (None where /proc is missing)."""

    def __init__(self, period_s: float = SAMPLE_PERIOD_S, proc: Path = PROC) -> None:
        self._period_s = period_s
        self._proc = proc
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_bytes: int | None = None

    def __enter__(self) -> RssSampler:
        if (self._proc / "self" / "stat").exists():
            self.peak_bytes = 0
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def sample(self) -> None:
        """One sample now (the thread calls this every period)."""
        if self.peak_bytes is not None:
            self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(os.getpid(), self._proc))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._period_s)
