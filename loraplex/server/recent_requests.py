"""``RecentRequests``: which revision answered a tenant's recent request, for client feedback.

``POST /v1/feedback`` names a response id; this bounded map says which revision answered it and
for whom, so the rating counts for that revision (``ReleaseTraffic``) and only its own tenant
may give it. Torch-free.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

from loraplex.clock import Clock


@dataclass(frozen=True)
class Served:
    """A recent response, as the feedback route needs it."""

    revision: str | None  # tenant/name@revision that answered; None: the base model
    at_s: float  # release-clock time it started
    caller: str  # ``caller_key`` of who asked (what its rating counts as)
    rated: bool = False  # a request is rated at most once


class RecentRequests:
    """(tenant, response id) -> the revision that answered, for ``POST /v1/feedback``.

    Keyed by tenant too: response ids are client-chosen (``X-Request-Id``), so two tenants may
    pick the same one, and neither can see, rate or displace the other's entry. A tenant that
    re-uses one of its own ids replaces its entry (that newer request was served, so rating it
    is legitimate; the older one can no longer be rated). Bounded twice: each tenant keeps at
    most ``max_entries_per_tenant`` (its oldest dropped first) and all at most ``max_entries``
    (then every tenant's expired entries go, and if that is not enough the oldest of the tenant
    holding the most: the tenant adding, when it is tied for the most), so a tenant's flood
    evicts only its own entries while others hold no more. An entry lives ``ttl_s``."""

    def __init__(
        self,
        clock: Clock,
        *,
        max_entries: int = 100_000,
        max_entries_per_tenant: int = 10_000,
        ttl_s: float = 3600.0,
    ):
        if min(max_entries, max_entries_per_tenant) < 1 or not ttl_s > 0:
            raise ValueError(
                f"max_entries {max_entries} / max_entries_per_tenant {max_entries_per_tenant} "
                f"/ ttl_s {ttl_s} is invalid; expected >= 1 / >= 1 / > 0"
            )
        self._clock = clock
        self._max_entries = max_entries
        self._max_per_tenant = max_entries_per_tenant
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._tenants: dict[str, OrderedDict[str, Served]] = {}  # each in insertion order
        self._count = 0  # entries over all tenants

    def remember(self, tenant: str, response_id: str, revision: str | None, caller: str) -> None:
        now = self._clock.now()
        with self._lock:
            entries = self._tenants.setdefault(tenant, OrderedDict())
            self._count -= len(entries)
            entries.pop(response_id, None)  # a re-used id: the newer request replaces it
            entries[response_id] = Served(revision, now, caller)
            self._expire(entries, now)
            while len(entries) > self._max_per_tenant:
                entries.popitem(last=False)
            self._count += len(entries)
            if self._count > self._max_entries:
                self._expire_all(now)  # idle tenants' expired entries first, never live ones
            while self._count > self._max_entries:
                largest = max(self._tenants.values(), key=len)
                if len(entries) == len(largest):  # tied at the most: the tenant adding pays
                    largest = entries
                largest.popitem(last=False)
                self._count -= 1

    def get(self, tenant: str, response_id: str) -> Served | None:
        """``tenant``'s entry for ``response_id``; None: unknown, expired or another's."""
        with self._lock:
            return self._live(tenant, response_id)

    def claim(self, tenant: str, response_id: str) -> Served | None:
        """Marks ``tenant``'s entry rated and returns it as it was (``rated`` True: it had been
        rated before, nothing changed); None when there is no such live entry. One step, so
        a concurrent re-use of the id cannot slip between the check and the mark."""
        with self._lock:
            served = self._live(tenant, response_id)
            if served is not None and not served.rated:
                self._tenants[tenant][response_id] = replace(served, rated=True)
            return served

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def _live(self, tenant: str, response_id: str) -> Served | None:
        entries = self._tenants.get(tenant)
        if entries is None:
            return None
        self._count -= len(entries)
        self._expire(entries, self._clock.now())
        self._count += len(entries)
        return entries.get(response_id)

    def _expire_all(self, now: float) -> None:
        """Drops every tenant's expired entries (and the maps left empty). Expiry otherwise runs
        per tenant, on its own calls, so an idle tenant's expired entries would still count."""
        for tenant, entries in list(self._tenants.items()):
            self._count -= len(entries)
            self._expire(entries, now)
            self._count += len(entries)
            if not entries:
                del self._tenants[tenant]

    def _expire(self, entries: OrderedDict[str, Served], now: float) -> None:
        # Entries are in insertion order, so expired ones are at the front.
        while entries and now - next(iter(entries.values())).at_s >= self._ttl_s:
            entries.popitem(last=False)
