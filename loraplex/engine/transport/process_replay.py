"""Calls the engine process sends a new (or recovered) child without waiting for their replies:
the tenant settings it may not have and the standing settings (``engine/standing.py``: pins,
warm policies, merge holds, a dedication) of the child before it.

Nobody waits, because the child runs its messages in order: a call sent before any request
is applied before that request reaches its engine. A call that fails is logged, never raised:
the child is up, and one setting it refused must not keep it out of service.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from concurrent.futures import Future
from typing import Any

from loraplex.engine.transport.messages import CacheCall, CacheCommand
from loraplex.engine.transport.process_inflight import InFlight
from loraplex.engine.transport.process_link import ChildLink

_log = logging.getLogger(__name__)


def send_unawaited(link: ChildLink, inflight: InFlight, command: CacheCommand, what: str) -> None:
    """Sends ``command`` to ``link``'s child as a call nobody awaits (a loading one's load
    neither); a failure is logged naming ``what``."""
    loaded: Future[None] | None = Future() if command.loads else None
    call_id, future = inflight.add_call(loaded)
    log = functools.partial(_log_failure, what)
    future.add_done_callback(log)
    if loaded is not None:
        loaded.add_done_callback(log)
    with contextlib.suppress(OSError, ValueError):  # it died: the reader fails the call at EOF
        link.send(CacheCall(call_id, command))


def _log_failure(what: str, future: Future[Any]) -> None:
    error = future.exception()
    if error is not None:
        _log.error("sending %s to the engine process failed", what, exc_info=error)
