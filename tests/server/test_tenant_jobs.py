"""A tenant's tokenizing and formatting hold at most ``MAX_JOBS_PER_TENANT`` threads of the
shared pool (``server/tenant_jobs.py``): 60 connections of one tenant sending ``/tokenize`` with
``return_token_strs`` held another tenant's ``GET /v1/models`` for seconds, first come first
served behind them (``scripts/attacks/attack13/thread-pool-crowd``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import Served, make_app_deps
from fakes import CharTokenizer, FakeEngine, on_event_loop
from fastapi.testclient import TestClient

from loraplex.server.app import create_app
from loraplex.server.tenant_jobs import MAX_JOBS_PER_TENANT, MAX_LARGE_BODIES_PER_TENANT, TenantJobs

HOLD_S = 0.3  # each counted call (``_Counted``): long enough for calls sent at once to overlap
WAIT_S = 60.0  # far beyond any wait here, on a loaded machine too


class SlowTokenizer(CharTokenizer):
    """Encodes a prompt starting with ``slow`` once ``gate`` opens (at most ``WAIT_S`` later),
    counting how many do at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.gate = threading.Event()
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
            if not self.gate.wait(WAIT_S):
                raise RuntimeError(f"the gate stayed shut for {WAIT_S} s")
            return super().encode(text)
        finally:
            with self._lock:
                self.running -= 1


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {WAIT_S} s"
        time.sleep(0.01)


def test_a_tenants_jobs_hold_at_most_their_share_of_the_pool(served: Served) -> None:
    """NOTE: the slow encodes hold their places until the test opens a gate, not for a fixed
    time: with each held 0.3 s, on a loaded machine they did not all overlap (or had not
    started when the other tenant's request came), which no bound was broken by."""
    tokenizer = SlowTokenizer()
    deps = make_app_deps(served, FakeEngine(char_tokenizer=tokenizer))
    acme = {"Authorization": f"Bearer {served.keys['acme']}"}
    globex = {"Authorization": f"Bearer {served.keys['globex']}"}
    with TestClient(create_app(deps)) as client, ThreadPoolExecutor(32) as pool:

        def tokenize(headers: dict[str, str], prompt: str) -> int:
            reply = client.post("/tokenize", json={"prompt": prompt}, headers=headers)
            return reply.status_code

        slow = [pool.submit(tokenize, acme, "slow") for _ in range(2 * MAX_JOBS_PER_TENANT)]
        try:

            def placed() -> bool:  # acme's first encodes run, the rest wait for a place
                places = deps.jobs._places.get("acme")
                waiting = 0 if places is None else places.statistics().tasks_waiting
                return tokenizer.running == waiting == MAX_JOBS_PER_TENANT

            _wait_until(placed, "two of acme's encodes running and two waiting for a place")
            assert tokenize(globex, "fast") == 200  # not queued behind acme's
        finally:
            tokenizer.gate.set()
        assert [f.result() for f in slow] == [200] * len(slow)
    assert tokenizer.most == MAX_JOBS_PER_TENANT  # all at once before (the pool has 40)
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
    # 2, not 8: more jobs of one tenant at once did no more and held other tenants' requests
    # longer on the GIL (docs/benchmarks/attack13.md, *Fewer places*)
    assert MAX_JOBS_PER_TENANT == 2 and TenantJobs()._max == 2


def test_a_tenants_large_bodies_are_parsed_within_its_share(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body over ``INLINE_JSON_BYTES`` is parsed on the pool (``json_route.py``), in one of its
    tenant's places too, and one of its large-body places: 1 at a time (8 before attack14)."""
    from loraplex.server import json_route

    counted = _Counted(json_route.loads_unique)
    monkeypatch.setattr(json_route, "loads_unique", counted)
    body = {"prompt": "y" * (json_route.INLINE_JSON_BYTES + 1)}
    statuses = _crowd(served, "/tokenize", {"json": body})
    assert set(statuses) <= {200, 400}
    assert counted.most == MAX_LARGE_BODIES_PER_TENANT  # 1 at a time (attack14)


class _Counted:
    """Wraps ``real``: a call off the event loop takes ``HOLD_S`` and is counted (most at once);
    a call on the loop runs as it is (a sleep there would hold every request)."""

    def __init__(self, real: Callable[..., object]) -> None:
        self._real, self._lock = real, threading.Lock()
        self.running = self.most = self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        if on_event_loop():
            return self._real(*args, **kwargs)
        with self._lock:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(HOLD_S)
            return self._real(*args, **kwargs)
        finally:
            with self._lock:
                self.running -= 1


def _crowd(served: Served, path: str, send: dict[str, Any], method: str = "POST") -> list[int]:
    """``2 * MAX_JOBS_PER_TENANT`` requests of acme at once; their statuses."""
    deps = make_app_deps(served, FakeEngine())
    acme = {"Authorization": f"Bearer {served.keys['acme']}"}
    with TestClient(create_app(deps)) as client, ThreadPoolExecutor(32) as pool:
        replies = [
            pool.submit(client.request, method, path, headers=acme, **send)
            for _ in range(2 * MAX_JOBS_PER_TENANT)
        ]
        statuses = [r.result().status_code for r in replies]
    assert deps.cache is not None
    deps.cache.close()
    return statuses


def test_a_tenants_streamed_logprob_events_are_formatted_within_its_share(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streamed event of more than ``MAX_LOOP_LOGPROB_ENTRIES`` logprob entries (an echoed
    prompt's) is formatted on the pool (``streaming.py``), in one of its tenant's places: it took
    the pool first come first served before."""
    from loraplex.server import streaming

    counted = _Counted(streaming.completion_logprobs)
    monkeypatch.setattr(streaming, "completion_logprobs", counted)
    prompt = "the acme support team " * 5  # 110 prompt tokens on the fake engine's tokenizer
    body = {"model": "support", "prompt": prompt, "echo": True, "logprobs": 1, "stream": True}
    statuses = _crowd(served, "/v1/completions", {"json": body | {"max_tokens": 1}})
    assert statuses == [200] * len(statuses)
    assert counted.calls == len(statuses)  # each stream's echo event, off the loop
    assert counted.most == MAX_JOBS_PER_TENANT  # all at once before


def test_a_tenants_long_integer_lookups_run_within_its_share(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Naming the field of a too-long integer parses the body again on the pool (``errors.py``),
    in one of its tenant's places: it took the pool first come first served before."""
    from loraplex.server import errors

    counted = _Counted(errors.huge_integer)
    monkeypatch.setattr(errors, "huge_integer", counted)
    text = '{"model": "support", "prompt": [' + "1, " * 100 + "9" * 5000 + "]}"
    statuses = _crowd(served, "/v1/completions", {"content": text})
    assert statuses == [400] * len(statuses)
    assert counted.calls == len(statuses)
    assert counted.most == MAX_JOBS_PER_TENANT  # all at once before


def test_a_tenants_model_listings_are_read_within_its_share(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /v1/models`` reads up to ``MAX_UNPAGED_CARDS`` adapters and their signing rows on
    the pool (``routes_models.py``), in one of its tenant's places: a sync route took the pool
    first come first served before."""
    counted = _Counted(served.registry.usable_adapters)
    monkeypatch.setattr(served.registry, "usable_adapters", counted)
    statuses = _crowd(served, "/v1/models", {}, method="GET")
    assert statuses == [200] * len(statuses)
    assert counted.calls >= len(statuses)
    assert counted.most == MAX_JOBS_PER_TENANT  # all at once before


@pytest.mark.parametrize("model", ["support", "acme/support"])
def test_a_tenants_model_lookups_are_read_within_its_share(
    served: Served, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """``GET /v1/models/{model}`` resolves the model and reads its adapter and signing rows on
    the pool (``routes_models.py``), in one of its tenant's places: each of its three reads took
    the pool first come first served before."""
    counted = _Counted(served.registry.get_adapter)
    monkeypatch.setattr(served.registry, "get_adapter", counted)
    statuses = _crowd(served, f"/v1/models/{model}", {}, method="GET")
    assert statuses == [200] * len(statuses)
    assert counted.calls == len(statuses)
    assert counted.most == MAX_JOBS_PER_TENANT  # all at once before
