"""``/ready`` needs no key: a flood of it must not become a flood of registry pings on the
thread pool. Concurrent callers share one ping, and its answer (a failure too) is reused for
``readiness.PING_INTERVAL_S``."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from conftest import Served, make_app_deps
from fakes import FakeEngine

from loraplex.server import readiness
from loraplex.server.app import create_app
from loraplex.server.readiness import RegistryPing


class CountedPing:
    """A registry ping that counts its calls, the threads inside at once, and can fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.inside = 0
        self.most_inside = 0
        self.error: Exception | None = None
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.calls += 1
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        threading.Event().wait(0.05)  # a database round trip
        with self._lock:
            self.inside -= 1
        if self.error is not None:
            raise self.error


def test_over_http_a_flood_of_ready_is_one_registry_ping(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 concurrent ``/ready`` calls: before, 200 pings on the thread pool (up to its size at
    once); now one, and the answers are all "ready"."""
    monkeypatch.setattr(readiness, "PING_INTERVAL_S", 3600.0)  # the flood outlasts no interval
    deps = make_app_deps(served, FakeEngine())
    ping = CountedPing()
    monkeypatch.setattr(deps.registry, "ping", ping)
    app = create_app(deps)

    async def flood() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await asyncio.gather(*(client.get("/ready") for _ in range(200)))

    answers = asyncio.run(flood())
    assert [a.status_code for a in answers] == [200] * 200
    assert ping.calls == 1 and ping.most_inside == 1
    assert deps.cache is not None
    deps.cache.close()


def test_an_answer_is_reused_for_the_interval_a_failure_too() -> None:
    now = [0.0]
    ping = CountedPing()
    shared = RegistryPing(ping, interval_s=1.0, clock=lambda: now[0])

    async def failures(count: int) -> list[str | None]:
        return list(await asyncio.gather(*(shared.failure() for _ in range(count))))

    assert asyncio.run(failures(20)) == [None] * 20
    assert ping.calls == shared.num_pings == 1
    ping.error = OSError("database gone")
    now[0] = 0.99
    assert asyncio.run(failures(5)) == [None] * 5  # the answer is still fresh
    now[0] = 1.0
    assert asyncio.run(failures(5)) == ["OSError"] * 5
    assert ping.calls == 2
    now[0] = 1.5
    assert asyncio.run(failures(5)) == ["OSError"] * 5  # a failure is reused as well
    ping.error = None
    now[0] = 2.0
    assert asyncio.run(failures(1)) == [None]
    assert ping.calls == 3
