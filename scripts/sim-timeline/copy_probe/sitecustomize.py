"""An investigation probe, not part of loraplex: every copy into a GPU slot of a process, timed.

Put this directory first on ``PYTHONPATH`` and set ``SIMCOLD_PROBE_COPIES`` to a file path:
every Python process started with that environment (a ``bench sim`` run's serve child and Ray
workers inherit it; not a ``LORAPLEX_`` name, which ``bench/harness/process.own_env`` strips)
wraps ``loraplex.runtime.tier_backends.TierPipeline.install`` and appends one JSON line per
L1 -> L0 install: ``pid``, ``t_s`` (``time.monotonic`` as the install began),
``wait_s`` (the wait for the slot lock, which every forward holds: ``engine/runner.py``),
``copy_s`` (the copy under the lock) and the adapter key. Unset: nothing is wrapped. The
stage counter the cache keeps for the copy (``Stage.COPY``) is the sum of the two.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

_PATH = os.environ.get("SIMCOLD_PROBE_COPIES")


class _TimedLock:
    """The pipeline's slot lock, noting how long the last acquire waited (per thread)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.local = threading.local()

    def __enter__(self) -> None:
        start = time.monotonic()
        self._lock.acquire()
        self.local.acquired = time.monotonic()
        self.local.wait_s = self.local.acquired - start

    def __exit__(self, *exc: object) -> None:
        self.local.held_s = time.monotonic() - self.local.acquired
        self._lock.release()


def _install(path: str) -> None:
    from loraplex.residency.ledger import Tier
    from loraplex.runtime import tier_backends

    install = tier_backends.TierPipeline.install

    def timed(self, move, prepared, slot, cancel):  # type: ignore[no-untyped-def]
        if move.target is not Tier.L0:
            return install(self, move, prepared, slot, cancel)
        lock = self._slot_lock
        if not isinstance(lock, _TimedLock):
            lock = self._slot_lock = _TimedLock(lock)
        t_s = time.monotonic()
        seconds = install(self, move, prepared, slot, cancel)
        line = {
            "pid": os.getpid(),
            "t_s": round(t_s, 6),
            "wait_s": round(lock.local.wait_s, 6),
            "copy_s": round(lock.local.held_s, 6),
            "adapter": move.key.ref,
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        return seconds

    tier_backends.TierPipeline.install = timed  # type: ignore[method-assign]


if _PATH:
    with contextlib.suppress(ImportError):  # a process without loraplex (or torch) on its path
        _install(_PATH)
