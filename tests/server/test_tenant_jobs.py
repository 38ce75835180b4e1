"""A tenant's tokenizing and formatting hold at most ``MAX_JOBS_PER_TENANT`` threads of the
shared pool (``server/tenant_jobs.py``): 60 connections of one tenant sending ``/tokenize`` with
``return_token_strs`` held another tenant's ``GET /v1/models`` for seconds, first come first
served behind them (``scripts/attacks/attack13/thread-pool-crowd``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Served, make_app_deps
from fakes import CharTokenizer, FakeEngine
from fastapi.testclient import TestClient

from loraplex.server.app import create_app
from loraplex.server.tenant_jobs import MAX_JOBS_PER_TENANT, MAX_LARGE_BODIES_PER_TENANT, TenantJobs

HOLD_S = 0.3  # each slow encode: long enough for every request sent at once to overlap


class SlowTokenizer(CharTokenizer):
    """Encodes a prompt starting with ``slow`` in ``HOLD_S``, counting how many do at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0  # slow encodes at once, at most
        self.fast_during_slow = 0  # other encodes that ran while slow ones ran

    def encode(self, text: str) -> list[int]:
        if not text.startswith("slow"):
            with self._lock:
                self.fast_during_slow += self.running > 0
            return super().encode(text)
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(HOLD_S)
            return super().encode(text)
        finally:
            with self._lock:
                self.running -= 1


def test_a_tenants_jobs_hold_at_most_their_share_of_the_pool(served: Served) -> None:
    tokenizer = SlowTokenizer()
    deps = make_app_deps(served, FakeEngine(char_tokenizer=tokenizer))
    acme = {"Authorization": f"Bearer {served.keys['acme']}"}
    globex = {"Authorization": f"Bearer {served.keys['globex']}"}
    with TestClient(create_app(deps)) as client, ThreadPoolExecutor(32) as pool:

        def tokenize(headers: dict[str, str], prompt: str) -> int:
            reply = client.post("/tokenize", json={"prompt": prompt}, headers=headers)
            return reply.status_code

        slow = [pool.submit(tokenize, acme, "slow") for _ in range(2 * MAX_JOBS_PER_TENANT)]
        time.sleep(HOLD_S / 2)  # acme's first encodes are running, the rest wait for a place
        assert tokenize(globex, "fast") == 200  # not queued behind acme's
        assert [f.result() for f in slow] == [200] * len(slow)
    assert tokenizer.most == MAX_JOBS_PER_TENANT  # 16 at once before (the pool has 40)
    assert tokenizer.fast_during_slow == 1
    assert deps.cache is not None
    deps.cache.close()


def test_a_tenants_places_are_forgotten_when_idle() -> None:
    import anyio

    jobs = TenantJobs(2)

    async def main() -> None:
        async with jobs.place("acme"), jobs.place("acme"):
            assert set(jobs._places) == {"acme"}
        assert jobs._places == {} and jobs._users == {}

    anyio.run(main)
    with pytest.raises(ValueError, match="max_per_tenant 0"):
        TenantJobs(0)


def test_a_tenants_large_bodies_are_parsed_within_its_share(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body over ``INLINE_JSON_BYTES`` is parsed on the pool (``json_route.py``), in one of its
    tenant's places too, and one of its large-body places: 1 at a time (8 before attack14)."""
    from loraplex.server import json_route

    lock, counts = threading.Lock(), {"running": 0, "most": 0}
    real = json_route.loads_unique

    def slow(body: bytes | str) -> object:
        with lock:
            counts["running"] += 1
            counts["most"] = max(counts["most"], counts["running"])
        try:
            time.sleep(HOLD_S)
            return real(body)
        finally:
            with lock:
                counts["running"] -= 1

    monkeypatch.setattr(json_route, "loads_unique", slow)
    deps = make_app_deps(served, FakeEngine())
    acme = {"Authorization": f"Bearer {served.keys['acme']}"}
    body = {"prompt": "y" * (json_route.INLINE_JSON_BYTES + 1)}
    with TestClient(create_app(deps)) as client, ThreadPoolExecutor(32) as pool:
        replies = [
            pool.submit(client.post, "/tokenize", json=body, headers=acme)
            for _ in range(2 * MAX_JOBS_PER_TENANT)
        ]
        assert {r.result().status_code for r in replies} <= {200, 400}
    assert counts["most"] == MAX_LARGE_BODIES_PER_TENANT
    assert deps.cache is not None
    deps.cache.close()
