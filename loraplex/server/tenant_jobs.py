"""``TenantJobs``: each tenant's share of the server's thread pool.

Tokenizing, ``/tokenize``'s token strings, ``echo``, a non-streamed answer's formatting and the
parse of a large body (``json_route.py``) run on the thread pool (anyio's default, 40 threads),
as do every tenant's key check and ``model``'s resolution. The pool is first come first served:
60 connections of one tenant sending ``/tokenize`` of 32,000 emoji with ``return_token_strs``
held another tenant's ``GET /v1/models`` 8.3-13.1 s median, against 0.10-0.22 s with
one-character prompts (``scripts/attacks/attack13/thread-pool-crowd``). Here each such job of a
tenant takes one of its ``MAX_JOBS_PER_TENANT`` places before it asks for a thread: the rest
wait on the tenant's own semaphore holding no thread, so the pool keeps threads for the other
tenants' key checks, resolutions and jobs. Event-loop only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

# A tenant's jobs on the thread pool at once (not a setting): a fifth of anyio's default 40.
MAX_JOBS_PER_TENANT = 8
# A tenant's bodies over 64 KiB parsed and validated at once (not a setting; ``json_route.py``).
# NOTE: the parse and the validation hold the GIL for most of their time, so a place on the pool
# did not bound what one tenant took of the process: 8 connections of one tenant sending 2 MiB
# bodies took 8 of the 9 runnable threads' turns, and another tenant's 1-token completion waited
# 1.1-1.8 s at the median with the validation already off the event loop. Honest bodies that large
# are few and parse in milliseconds.
MAX_LARGE_BODIES_PER_TENANT = 1


class TenantJobs:
    """Places for each tenant's CPU-heavy jobs on the thread pool, ``max_per_tenant`` each:
    ``async with jobs.place(tenant): await run_in_threadpool(job)``."""

    def __init__(self, max_per_tenant: int = MAX_JOBS_PER_TENANT) -> None:
        if max_per_tenant < 1:
            raise ValueError(f"max_per_tenant {max_per_tenant} is invalid; expected >= 1")
        self._max = max_per_tenant
        self._places: dict[str, anyio.Semaphore] = {}  # tenants with a job running or waiting
        self._users: dict[str, int] = {}  # their jobs running or waiting

    @asynccontextmanager
    async def place(self, tenant: str) -> AsyncIterator[None]:
        """One of ``tenant``'s places, waited for holding no thread."""
        places = self._places.get(tenant)
        if places is None:
            places = self._places[tenant] = anyio.Semaphore(self._max)
        self._users[tenant] = self._users.get(tenant, 0) + 1
        try:
            async with places:
                yield
        finally:
            self._users[tenant] -= 1
            if not self._users[tenant]:  # forgotten when idle: the map holds active tenants
                del self._users[tenant], self._places[tenant]
