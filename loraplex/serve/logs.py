"""The server's own log lines: one stderr handler on the ``loraplex`` logger tree, with time,
level and logger name, at the ``log_level`` of ``loraplex serve`` / ``fleet up``.

``configure_logging`` is called where a server process starts (``loraplex serve``, its engine
child, ``fleet up`` and a fleet's replicas), never at import: a library user who imports
loraplex keeps Python's defaults (the last-resort handler: WARNING and above, bare). uvicorn
takes the same level through its own config (``ListenerConfig(log_level=...)``) and keeps its
own format and handlers (the access log stays on stdout).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from typing import TextIO

# The levels both loraplex's loggers and uvicorn's take (uvicorn's "trace" has no Python level).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
DEFAULT_LOG_LEVEL = "info"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ROOT_LOGGER = "loraplex"
_HANDLER_NAME = "loraplex-stderr"  # ours, replaced (never added twice) by a second call


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is when a line is written, as Python's last-resort handler
    does: a stream replaced after the start (a test runner's capture, since closed) is never
    written to."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        del value  # StreamHandler's constructor sets it


def stderr_file() -> str | None:
    """The file this process's stderr (file descriptor 2) writes to, when it is a regular file
    (a fleet replica's: Ray's ``<session>/logs/worker-*-<pid>.err``, where its ``loraplex`` lines
    go); None for a terminal, a pipe, or where ``/proc`` cannot say (not Linux)."""
    try:
        if not stat.S_ISREG(os.fstat(2).st_mode):
            return None
        return os.readlink("/proc/self/fd/2")
    except OSError:
        return None


def check_log_level(level: str) -> None:
    """ValueError naming ``log_level`` unless ``level`` is one of ``LOG_LEVELS``."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log_level {level!r} is invalid; expected one of {list(LOG_LEVELS)}")


def configure_logging(level: str) -> logging.Handler:
    """Sends the ``loraplex`` tree's lines at ``level`` and above to stderr, formatted, and
    returns the handler. NOTE: the tree stops propagating: a root handler (Ray's in a worker, a
    host application's) would otherwise print each line a second time."""
    check_log_level(level)
    logger = logging.getLogger(ROOT_LOGGER)
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    handler = _StderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return handler
