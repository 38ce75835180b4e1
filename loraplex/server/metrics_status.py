"""``loraplex_tenant_responses_total{priority_class, code}``: the tenant API's answers by the
caller's priority class and status, so 429 and 503 rates can be alerted on per class.

Counted by an ASGI middleware outside ``RequestLimits`` (which refuses over-rate callers with a
429 before any route runs), at the response's start. Only requests whose tenant key was checked
are counted: ``RequestLimits`` records the tenant's class in the request state before charging
its rate (``PRIORITY_CLASS_STATE``); unauthenticated and admin requests carry none. Both labels
take values from fixed sets: the classes of ``PriorityClass`` and the codes ``429``, ``503`` and
the status classes ``2xx``..``5xx`` of every other status.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.registry.models import PriorityClass

PRIORITY_CLASS_STATE = "loraplex_priority_class"  # request state: the caller's class (str)
_OWN_CODES = frozenset({429, 503})  # statuses alerted on by name
# every label alerted on (LoraplexServerErrors reads 5xx: 503 aside, a failure an operator fixes)
_ALERTED = (*(str(code) for code in sorted(_OWN_CODES)), "5xx")


def code_label(status: int) -> str:
    """``429`` / ``503`` as themselves, every other status as its class (``2xx``)."""
    return str(status) if status in _OWN_CODES else f"{status // 100}xx"


class StatusCounts(Collector):
    """Responses per (priority class, code label); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # 429, 503 and 5xx of every class from 0: a series born at 1 hides its first increase
        # (NOTE: 5xx was born at its first count, so the first adapter that failed to load,
        # three 500s before one scrape, raised no increase at all)
        self._counts: Counter[tuple[str, str]] = Counter(
            dict.fromkeys(((c.value, code) for c in PriorityClass for code in _ALERTED), 0)
        )

    def count(self, priority_class: str, status: int) -> None:
        with self._lock:
            self._counts[priority_class, code_label(status)] += 1

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "loraplex_tenant_responses",
            "Tenant API responses by the caller's priority class and status (429, 503, Nxx).",
            labels=("priority_class", "code"),
        )
        with self._lock:
            rows = sorted(self._counts.items())
        for (priority_class, code), count in rows:
            family.add_metric((priority_class, code), count)
        yield family


class CountStatuses:
    """ASGI middleware: counts each tenant response in ``counts()`` when it starts."""

    def __init__(self, app: ASGIApp, counts: Callable[[], StatusCounts]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                priority_class = scope.get("state", {}).get(PRIORITY_CLASS_STATE)
                if isinstance(priority_class, str):
                    self.counts().count(priority_class, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)
