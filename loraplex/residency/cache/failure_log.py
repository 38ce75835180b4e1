"""The operator's trace of a load that failed: a tenant gets only ``adapter_load_failed`` (500,
"an operator has to fix or replace it"), so the server log names the revision and the error.

At most one line per revision a minute: a tenant retrying a broken revision starts a load (and
a failure) per request, and must not fill the log with it.
"""

from __future__ import annotations

import logging

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import Clock
from loraplex.errors import AdapterError, ArtifactNotFoundError, LoadCancelledError

_log = logging.getLogger(__name__)
LOG_INTERVAL_S = 60.0  # one line per revision at most this often
MAX_REMEMBERED = 1024  # revisions whose last line is remembered; then the memory starts over


class FailureLog:
    """Says which revision failed to load and why, bounded per revision."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._said: dict[AdapterKey, float] = {}  # revision -> when its last line was written

    def failed(self, key: AdapterKey, error: BaseException) -> None:
        # what the tenant API turns into adapter_load_failed (server/errors.py); a cancelled
        # load is a client leaving, not a broken revision
        if isinstance(error, LoadCancelledError) or not isinstance(
            error, AdapterError | ArtifactNotFoundError
        ):
            return
        now = self._clock.now()
        last = self._said.get(key)
        if last is not None and now - last < LOG_INTERVAL_S:
            return
        if len(self._said) >= MAX_REMEMBERED:
            self._said.clear()
        self._said[key] = now
        _log.warning(
            "adapter %s failed to load (%s): %s; `loraplex adapters verify %s` re-checks it",
            key.ref,
            type(error).__name__,
            error,
            key.ref,
        )
