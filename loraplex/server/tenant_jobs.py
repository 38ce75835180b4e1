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

A place is taken too by a streamed event's formatting with many logprob entries
(``streaming.py``), the second parse that names a body's too-long integer (``errors.py``), the
model list's read and a model card's lookup (``routes_models.py``). An admin's call (one
trusted credential, no tenant) runs unplaced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from starlette.concurrency import run_in_threadpool

from loraplex.registry import Tenant

# A tenant's jobs on the thread pool at once (not a setting). NOTE: 2, not 8: the jobs are
# Python code under one GIL, so more of them at once got the tenant no more done and made every
# other request wait longer for the GIL. Beside ``thread-pool-crowd`` another tenant's ``GET
# /v1/models`` waited a median 2.5-3.1 s with 8 and 0.45-0.94 s with 4 (one series), 0.74-0.87 s
# with 4 and 0.19-0.29 s with 2 (another); the attacker was answered 2.7-3.9, 3.9-4.2, 3.4-5.7 and
# 5.2-6.8 times a second (2 shared cores; docs/benchmarks/attack13.md, *Fewer places*).
MAX_JOBS_PER_TENANT = 2
# The scope state key under which ``limits.RequestLimits`` leaves the tenant it authenticated.
AUTHENTICATED_TENANT = "loraplex_tenant"
# A tenant's bodies over 64 KiB (or of more than ``INLINE_JSON_ITEMS``) parsed and validated at
# once (not a setting; ``json_route.py``).
# NOTE: the parse and the validation hold the GIL for most of their time, so a place on the pool
# did not bound what one tenant took of the process: with 8 places, 8 connections of one tenant
# sending 2 MiB bodies took 8 of the 9 runnable threads' turns, and another tenant's 1-token
# completion waited 1.1-1.8 s at the median with the validation already off the event loop.
# Honest bodies that large are few and parse in milliseconds.
MAX_LARGE_BODIES_PER_TENANT = 1

T = TypeVar("T")


def caller_of(scope: MutableMapping[str, Any]) -> str | None:
    """The name of the tenant ``limits.RequestLimits`` authenticated for this request; None on
    the admin API and before the key was checked."""
    tenant = scope.get("state", {}).get(AUTHENTICATED_TENANT)
    return tenant.name if isinstance(tenant, Tenant) else None


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

    async def run(self, tenant: str | None, job: Callable[..., T], *args: Any) -> T:
        """``job(*args)`` on the thread pool in one of ``tenant``'s places; unplaced when
        ``tenant`` is None (an admin's call)."""
        if tenant is None:
            return await run_in_threadpool(job, *args)
        async with self.place(tenant):
            return await run_in_threadpool(job, *args)
