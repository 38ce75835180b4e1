"""``RegistryPing``: what ``/ready`` knows of the registry database, at most one ping a second.

``/ready`` needs no key (probes carry none), and each answer used to ping the registry on the
thread pool: a client flooding it held a pool thread and a database round trip per request,
bounded only by the connection limits, and took the pool from requests. Now concurrent callers
share one ping (the others wait for it) and its answer is reused for ``PING_INTERVAL_S``, a
failure too (a database that is down is not asked again by every probe).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

PING_INTERVAL_S = 1.0  # an answer this old is reused (probes come every few seconds)


@dataclass(frozen=True)
class PingResult:
    """One registry ping's answer."""

    at_s: float  # when it finished, on the pinger's clock
    failure: str | None  # the exception's class name; None: the registry answered


class RegistryPing:
    """One registry ping at a time, its answer shared for ``interval_s`` (module docstring)."""

    def __init__(
        self,
        ping: Callable[[], None],
        interval_s: float = PING_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ping = ping
        self._interval_s = interval_s
        self._clock = clock
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._last: PingResult | None = None
        self.num_pings = 0  # pings sent to the registry

    async def failure(self) -> str | None:
        """Why the registry is not ready (an exception's class name), None when it answers."""
        last = self._fresh()
        if last is None:
            # NOTE: a lock per event loop: an app may be served by one loop after another
            # (tests), and an asyncio lock belongs to the loop that first waited on it.
            lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
            async with lock:  # the first caller pings; the others then find its answer
                last = self._fresh() or await self._run()
        return last.failure

    def _fresh(self) -> PingResult | None:
        last = self._last
        if last is None or self._clock() - last.at_s >= self._interval_s:
            return None
        return last

    async def _run(self) -> PingResult:
        self.num_pings += 1
        try:
            await run_in_threadpool(self._ping)
        except Exception as exc:  # any failure means "not ready"; the name is for operators
            failure: str | None = type(exc).__name__
        else:
            failure = None
        self._last = PingResult(self._clock(), failure)
        return self._last
