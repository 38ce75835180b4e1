"""The admin credential a server checks: fixed, or re-read from its key file when that file
changes, so the key can be rotated without a restart.

A server started without ``--admin-key`` checks the key kept in ``<data dir>/admin-key``.
``current()`` stats that file at most once per ``check_interval_s`` (one ``stat``, no read,
while it is unchanged) and reads it only when its inode, size, mtime or ctime moved. A new key that
is invalid, or a file gone or unreadable, is logged once per change and the key in force is
kept: a bad write never opens the admin API nor locks the operator out. A key given by
``--admin-key`` / ``LORAPLEX_ADMIN_KEY`` has no file and never changes.

Each change seen is counted by its outcome (``reloads``; on /metrics as
``loraplex_admin_key_reloads_total{outcome}``): ``reloaded`` (a new valid key is in force),
``invalid`` (the file holds a key that cannot be one), ``unreadable`` (gone, no permission, not
UTF-8). A change that leaves the same key (rewritten, touched) is no reload and not counted.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from loraplex.clock import Clock

_log = logging.getLogger(__name__)

# Tenant API tokens start with this; an admin key must not, so the two can never be confused.
TENANT_TOKEN_PREFIX = "lpx_"
MIN_ADMIN_KEY_CHARS = 16
CHECK_INTERVAL_S = 1.0  # how often the key file is looked at, at most
# The outcomes of a change of the key file, as counted (``AdminKey.reloads``).
RELOADED, INVALID, UNREADABLE = "reloaded", "invalid", "unreadable"
RELOAD_OUTCOMES = (RELOADED, INVALID, UNREADABLE)


def admin_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an admin credential; None when it can."""
    if len(key) < MIN_ADMIN_KEY_CHARS or key.startswith(TENANT_TOKEN_PREFIX):
        return (
            f"{len(key)} characters; expected at least {MIN_ADMIN_KEY_CHARS}, not starting "
            f"with {TENANT_TOKEN_PREFIX!r}"
        )
    return None


def _signature(path: Path) -> tuple[int, ...] | str:
    """What tells a changed file from the one read last, or why it cannot be looked at. NOTE:
    ctime too: generated keys all have one length, and ``cp -p`` of a backup keeps the inode
    and sets an old mtime, while any write moves the ctime."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


class AdminKey:
    """The admin key in force; ``path`` None: ``key`` for good."""

    def __init__(
        self,
        key: str,
        path: Path | None,
        clock: Clock,
        check_interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self._key = key
        self._path = path
        self._clock = clock
        self._check_interval_s = check_interval_s
        self._checked_s = clock.now()
        # NOTE: None, not the file's signature now: the key was read before this was built,
        # and a write in between would otherwise be taken as the file already read.
        self._seen: tuple[int, ...] | str | None = None
        self._lock = threading.Lock()  # checked from the event loop and the thread pool
        self._reloads = dict.fromkeys(RELOAD_OUTCOMES, 0)  # changes seen, by outcome

    def reloads(self) -> dict[str, int]:
        """Changes of the key file seen so far, by outcome (``RELOAD_OUTCOMES``; all 0 for a
        fixed key)."""
        with self._lock:
            return dict(self._reloads)

    @property
    def path(self) -> Path | None:
        """The file the key is re-read from; None: fixed."""
        return self._path

    def current(self) -> str:
        """The key in force, after a look at the file when one is due."""
        if self._path is None or self._clock.now() - self._checked_s < self._check_interval_s:
            return self._key
        with self._lock:
            self._checked_s = self._clock.now()
            seen = _signature(self._path)
            if seen != self._seen:
                self._seen = seen
                outcome = self._reload(self._path, seen)
                if outcome is not None:
                    self._reloads[outcome] += 1
            return self._key

    def _reload(self, path: Path, seen: tuple[int, ...] | str) -> str | None:
        """Reads a changed file; its outcome (None: the same key as before)."""
        kept = "the admin key in force is kept"
        if isinstance(seen, str):
            _log.error("admin key file %s cannot be read (%s); %s", path, seen, kept)
            return UNREADABLE
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            _log.error("admin key file %s cannot be read (%s); %s", path, exc, kept)
            return UNREADABLE
        problem = admin_key_problem(key)
        if problem is not None:
            _log.error("admin key file %s holds an invalid key (%s); %s", path, problem, kept)
            return INVALID
        if key == self._key:
            return None
        self._key = key
        _log.warning("admin key reloaded from %s: the previous key no longer works", path)
        return RELOADED
