"""Which adapters ``/metrics`` names in its labels: at most ``max_named`` at a time.

Adapter names in label values make series a tenant controls: one tenant cycling its adapters
made 54 label sets of ``vllm:lora_requests_info`` in 20 s. So the names that may appear are a
bounded set: an adapter gets a name when it is first seen (requested, or in the engine's
running / waiting lists) while fewer than ``max_named`` are named, and keeps it while it is seen;
one unseen for ``forget_after_s`` gives its name back. Every other adapter appears as ``OTHER``:
in ``lora_requests_info``'s lists once, in ``loraplex_adapter_requests_total`` as one series per
priority class carrying their requests together. A forgotten name's requests move to ``OTHER``
too, so the counts of every series always add up to every adapter request served.

Names are shared fairly among tenants: when every name is taken, a new adapter of a tenant
holding fewer names than another takes that tenant's least recently seen name (its requests
move to ``OTHER``), so no tenant holds more than an equal share while another wants one. NOTE:
first come alone let one tenant, requesting 64 of its adapters every few minutes, keep every
name, so every other tenant's adapters were ``OTHER`` for good, in ``lora_requests_info``'s lists
too (the signal an endpoint picker routes adapter affinity by).

Names are ``tenant/name`` (the adapter, not the revision: a new revision is not a new series).
Thread-safe; time is injected.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

OTHER = "__other__"  # the label of every adapter without a name of its own
DEFAULT_MAX_NAMED = 64
FORGET_AFTER_S = 600.0  # an adapter unseen this long gives its name back


class AdapterLabels:
    """The named adapters and the request counts per (label, priority class)."""

    def __init__(
        self,
        max_named: int = DEFAULT_MAX_NAMED,
        clock: Callable[[], float] = time.monotonic,
        forget_after_s: float = FORGET_AFTER_S,
    ) -> None:
        if max_named < 0:
            raise ValueError(f"max_named {max_named} is invalid; expected >= 0")
        self._max_named = max_named
        self._clock = clock
        self._forget_after_s = forget_after_s
        self._lock = threading.Lock()
        self._seen_s: dict[str, float] = {}  # named adapter -> when last seen
        self._requests: Counter[tuple[str, str]] = Counter()  # (label, class) -> requests

    def labels(self, adapters: Iterable[str]) -> list[str]:
        """The labels of ``adapters`` (seen now), sorted, ``OTHER`` at most once."""
        with self._lock:
            now_s = self._clock()
            return sorted({self._label(adapter, now_s) for adapter in adapters})

    def count_request(self, adapter: str, priority_class: str) -> None:
        """One request of ``adapter`` by a tenant of ``priority_class``."""
        with self._lock:
            self._requests[self._label(adapter, self._clock()), priority_class] += 1

    def request_totals(self) -> list[tuple[str, str, int]]:
        """(label, priority class, requests) of every series, by label."""
        with self._lock:
            self._forget(self._clock())
            return sorted((label, cls, n) for (label, cls), n in self._requests.items())

    def _label(self, adapter: str, now_s: float) -> str:
        if adapter in self._seen_s:
            self._seen_s[adapter] = now_s
            return adapter
        if len(self._seen_s) >= self._max_named:
            self._forget(now_s)
        if len(self._seen_s) >= self._max_named and not self._take_from_largest(adapter):
            return OTHER
        self._seen_s[adapter] = now_s
        return adapter

    def _take_from_largest(self, adapter: str) -> bool:
        """Frees the least recently seen name of the tenant holding the most, when it holds at
        least two more than ``adapter``'s tenant (so names never pass back and forth)."""
        held = Counter(_tenant(named) for named in self._seen_s)
        if not held:
            return False
        largest, count = max(held.items(), key=lambda item: (item[1], item[0]))
        if count < held[_tenant(adapter)] + 2:
            return False
        oldest = min(
            (a for a in self._seen_s if _tenant(a) == largest), key=self._seen_s.__getitem__
        )
        self._drop(oldest)
        return True

    def _forget(self, now_s: float) -> None:
        """Names unseen for ``forget_after_s`` go; their requests move to ``OTHER``."""
        stale = [a for a, seen_s in self._seen_s.items() if now_s - seen_s >= self._forget_after_s]
        for adapter in stale:
            self._drop(adapter)

    def _drop(self, adapter: str) -> None:
        """``adapter`` gives its name back; its requests move to ``OTHER``."""
        del self._seen_s[adapter]
        for label, cls in [k for k in self._requests if k[0] == adapter]:
            self._requests[OTHER, cls] += self._requests.pop((label, cls))


def _tenant(adapter: str) -> str:
    return adapter.partition("/")[0]
