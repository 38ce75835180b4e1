"""A tenant's body over 64 KiB is parsed and validated off the event loop, one at a time per
tenant (``server/json_route.py``, ``tenant_jobs.MAX_LARGE_BODIES_PER_TENANT``), and a field
loraplex does not implement is refused before its schema reads it (``fields.neutral_only``):
8 connections of one tenant sending 2 MiB bodies held another tenant's 1-token completion 0.7-2.5 s
at the median (``scripts/attacks/attack14/body-crowd``)."""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import Rig
from fastapi import APIRouter, FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from loraplex.errors import quoted
from loraplex.registry import PriorityClass, Tenant, TenantQuotas
from loraplex.server import json_route
from loraplex.server.auth import AUTHENTICATED_TENANT
from loraplex.server.errors import install_error_handlers
from loraplex.server.json_route import INLINE_JSON_BYTES, INLINE_JSON_ITEMS, StrictJsonRoute
from loraplex.server.protocol import ChatCompletionRequest
from loraplex.server.tenant_jobs import MAX_LARGE_BODIES_PER_TENANT, TenantJobs

VALIDATED_ON: list[str] = []  # the thread each ``_Body`` was validated on


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[int]

    @field_validator("items")
    @classmethod
    def _where(cls, items: list[int]) -> list[int]:
        VALIDATED_ON.append(threading.current_thread().name)
        return items


def _app() -> FastAPI:
    """A route of ``_Body`` whose every request comes from tenant acme, as after its key check."""
    app = FastAPI()
    install_error_handlers(app)
    app.state.deps = SimpleNamespace(
        jobs=TenantJobs(), large_bodies=TenantJobs(MAX_LARGE_BODIES_PER_TENANT), config=None
    )
    acme = Tenant("acme", PriorityClass.NORMAL, TenantQuotas(), 0.0)

    @app.middleware("http")
    async def as_acme(request: Request, call_next: Any) -> Any:
        request.scope.setdefault("state", {})[AUTHENTICATED_TENANT] = acme
        return await call_next(request)

    router = APIRouter(route_class=StrictJsonRoute)

    @router.post("/x")
    async def route(body: _Body) -> dict[str, Any]:
        return {"n": len(body.items), "loop": threading.current_thread().name}

    app.include_router(router)
    return app


def test_a_large_body_is_validated_off_the_event_loop() -> None:
    VALIDATED_ON.clear()
    many = [1] * (INLINE_JSON_BYTES // 2)  # "1," each: past the inline size
    with TestClient(_app()) as client:
        small = client.post("/x", json={"items": [1, 2]})
        large = client.post("/x", json={"items": many})
    assert small.status_code == large.status_code == 200, (small.text, large.text)
    assert large.json()["n"] == len(many)
    loop = small.json()["loop"]
    assert VALIDATED_ON[0] == loop  # a small body: FastAPI's own check, on the loop
    assert VALIDATED_ON[1:] == [VALIDATED_ON[1]] and VALIDATED_ON[1] != loop  # once, on the pool


def test_a_small_body_of_many_items_is_validated_off_the_event_loop() -> None:
    """A body's cost is its items, not its bytes: 147 messages of 16 empty text parts in 65,300
    bytes took 8.8 ms to parse and validate, on the event loop (``json_route.py``)."""
    VALIDATED_ON.clear()
    inline = [1] * (INLINE_JSON_ITEMS - 1)  # its commas, the "{" and the "[": at the cap
    many = [1] * INLINE_JSON_ITEMS
    with TestClient(_app()) as client:
        replies = [client.post("/x", json={"items": items}) for items in (inline, many)]
    assert [r.status_code for r in replies] == [200, 200], replies[1].text
    assert len(json.dumps({"items": many})) < INLINE_JSON_BYTES // 16
    loop = replies[0].json()["loop"]
    assert VALIDATED_ON[0] == loop  # at the cap: on the loop
    assert VALIDATED_ON[1:] == [VALIDATED_ON[1]] and VALIDATED_ON[1] != loop  # past it: the pool


def test_json_items_counts_separators_and_openings() -> None:
    assert json_route.json_items(b'{"a":[1,2],"b":{}}') == 5
    assert json_route.json_items(b'"x,y[z{"') == 3  # inside strings too: an upper bound
    assert json_route.parsed_inline(b"[" + b"1," * INLINE_JSON_ITEMS + b"1]") is False
    assert json_route.parsed_inline(b" " * INLINE_JSON_BYTES) is True
    assert json_route.parsed_inline(b" " * (INLINE_JSON_BYTES + 1)) is False


def test_a_large_invalid_body_gets_the_400_a_small_one_gets() -> None:
    with TestClient(_app()) as client:
        small = client.post("/x", json={"items": [1, "x"]})
        large = client.post("/x", json={"items": [1] * (INLINE_JSON_BYTES // 2) + ["x"]})
        extra = client.post("/x", json={"items": [1] * INLINE_JSON_BYTES, "zz": 1})
    assert small.status_code == large.status_code == extra.status_code == 400
    assert small.json()["error"]["param"] == "items.1"
    assert large.json()["error"]["param"] == f"items.{INLINE_JSON_BYTES // 2}"
    assert large.json()["error"]["message"].endswith(small.json()["error"]["message"][7:])
    assert extra.json()["error"]["param"] == "zz"


def test_a_tenants_large_bodies_are_parsed_one_at_a_time(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, running, most = threading.Lock(), {"acme": 0, "globex": 0}, {"acme": 0, "all": 0}
    parse = json_route.loads_unique

    def slow(body: bytes | str) -> Any:
        data = parse(body)
        owner = data["user"]
        with lock:
            running[owner] += 1
            most["acme"] = max(most["acme"], running["acme"])
            most["all"] = max(most["all"], sum(running.values()))
        time.sleep(0.2)
        with lock:
            running[owner] -= 1
        return data

    monkeypatch.setattr(json_route, "loads_unique", slow)

    def send(tenant: str) -> Any:
        model = {"acme": "support", "globex": "search"}[tenant]
        body = {"model": model, "prompt": "a" * INLINE_JSON_BYTES, "user": tenant}
        return rig.client.post("/v1/completions", json=body, headers=rig.headers(tenant))

    with ThreadPoolExecutor(8) as pool:
        acme = [pool.submit(send, "acme") for _ in range(4)]
        time.sleep(0.1)
        globex = pool.submit(send, "globex")
        replies = [f.result() for f in [*acme, globex]]
    assert [r.status_code for r in replies] == [200] * 5, replies[0].text
    assert most["acme"] == MAX_LARGE_BODIES_PER_TENANT == 1  # 4 at once before
    assert most["all"] == 2  # globex's did not wait behind acme's


class _Shown:
    """Counts how often it is shown."""

    calls = 0

    def __repr__(self) -> str:
        _Shown.calls += 1
        return "s"


def test_an_unimplemented_field_is_refused_before_its_value_is_read() -> None:
    _Shown.calls = 0
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate({**body, "tools": [{"a": _Shown()}] * 10_000})
    error = refused.value.errors(include_url=False)[0]
    assert error["loc"] == ("tools",) and "[{'a': s}, {'a': s}," in error["msg"]
    assert _Shown.calls <= 8  # the first items only: every one of them before
    for field, value in [("metadata", {"a": 1}), ("response_format", {"type": "json_object"})]:
        with pytest.raises(ValidationError, match=field):
            ChatCompletionRequest.model_validate({**body, field: value})
    neutral = {"tools": [], "metadata": {}, "response_format": {"type": "text"}}
    assert ChatCompletionRequest.model_validate({**body, **neutral, "tool_choice": "none"})


def test_quoted_shows_a_containers_first_items_in_their_order() -> None:
    _Shown.calls = 0
    assert quoted([_Shown()] * 100_000).startswith("[s, s, s, s, s, s, s, s, ...]")
    assert _Shown.calls == 8
    assert quoted({"b": 1, "a": [0] * 20}) == "{'b': 1, 'a': [0, 0, 0, 0, 0, 0, 0, 0, ...]}"
    assert quoted({"b": 1, "a": 2}) == repr({"b": 1, "a": 2})  # not sorted, as repr
    assert quoted("x" * 100) == repr("x" * 64) + "…"


def _turns_while_parsed(body: bytes) -> int:
    """How often this thread ran while another parsed ``body`` with ``loads_unique``: 0 or 1
    when the parse held the GIL from end to end."""
    began, done = threading.Event(), threading.Event()

    def parse() -> None:
        began.set()
        json_route.loads_unique(body)
        done.set()

    # NOTE: a short switch interval (0.2 ms, not 5) asks the parsing thread for the GIL ~25x
    # as often: a parse that runs Python code gives it back hundreds of times, whatever the
    # machine's speed or load (it read 9 turns under load at 5 ms), one in C still never does
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        thread = threading.Thread(target=parse)
        thread.start()
        began.wait()
        turns = 0
        while not done.is_set():
            turns += 1
            time.sleep(0.0005)  # gives the GIL up; the parse's thread must give it back
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    return turns


@pytest.mark.parametrize(
    "body",
    [
        b"[" + b",".join([b"1.0"] * 300_000) + b"]",  # a prompt of floats
        b"[" + b",".join([b"7"] * 400_000) + b"]",  # a prompt of ints
    ],
    ids=["floats", "ints"],
)
def test_a_flat_array_of_numbers_lets_the_event_loop_run_while_it_is_parsed(body: bytes) -> None:
    """A body with no object inside but one flat array was parsed in C from end to end, holding
    the GIL 0.2-0.5 s: two connections of one tenant sending 3 MiB of ``1.0`` raised another
    tenant's median 4.7x-6.0x (docs/benchmarks/attack22.md). The number hooks run Python code per
    number, where the interpreter hands the GIL over (1 turn here before, 16-17 after)."""
    assert _turns_while_parsed(body) >= 5
    assert json_route.loads_unique(b"[1, -2.5e3, 10000000000000000000000, 1.0]") == [
        1,
        -2500.0,
        10**22,
        1.0,
    ]
