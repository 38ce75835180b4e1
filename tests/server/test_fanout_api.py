"""``n``, ``best_of`` and batched prompts: one engine request per choice (ids, seeds and
prefix leaders as ``choices.py`` states), OpenAI's indices, the bounds, aborts reaching every
sibling, and ``X-Request-Id`` (echoed, never an engine id)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import httpx
import pytest
from conftest import Rig, Served, make_app_deps
from fakes import FakeEngine, fake_logprob
from openai import OpenAI
from starlette.requests import Request

from loraplex.engine.protocol import EngineRequest
from loraplex.errors import GenerationError
from loraplex.sampling import SamplingParams
from loraplex.server.app import create_app
from loraplex.server.choices import Fanout, Sibling
from loraplex.server.disconnect import ClientDisconnectedError, collect

REPLY = " acme/support@r1 answers."


def _api(rig: Rig, tenant: str = "acme") -> OpenAI:
    key = rig.served.keys[tenant]
    return OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=rig.client, max_retries=0
    )


def _events(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_n_fans_out_into_siblings_sharing_the_prompt(rig: Rig) -> None:
    done = _api(rig).completions.create(model="support", prompt="hi", n=3, seed=7, max_tokens=4)
    requests = rig.engine.requests
    base = requests[0].request_id.rsplit("-", 1)[0]
    assert [r.request_id for r in requests] == [f"{base}-{i}" for i in range(3)]
    assert [r.prefix_leader for r in requests] == [None, f"{base}-0", f"{base}-0"]
    assert [r.params.seed for r in requests] == [7, 8, 9]
    assert [(c.index, c.text) for c in done.choices] == [(i, REPLY) for i in range(3)]
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (3, 6)  # prompt once


def test_a_batch_of_prompts_indexes_choices_prompt_major(rig: Rig) -> None:
    done = _api(rig).completions.create(model="support", prompt=["a", "bb"], n=2, max_tokens=1)
    prompts = [r.prompt_token_ids for r in rig.engine.requests]
    assert prompts == [(1, 100), (1, 100), (1, 101, 101), (1, 101, 101)]
    assert [r.prefix_leader is None for r in rig.engine.requests] == [True, False, True, False]
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    assert done.usage is not None and done.usage.prompt_tokens == 2 + 3
    ids = _api(rig).completions.create(model="support", prompt=[[1, 70], [1, 71]], max_tokens=1)
    assert [r.prompt_token_ids for r in rig.engine.requests[-2:]] == [(1, 70), (1, 71)]
    assert len(ids.choices) == 2


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 17}, "n"), ({"best_of": 17}, "best_of"), ({"prompt": ["a"] * 5, "n": 4}, "prompt"),
        ({"prompt": ["a"] * 17}, "prompt"), ({"n": 3, "best_of": 2}, "best_of"),
        ({"n": 1, "best_of": 2, "stream": True}, "best_of"), ({"prompt": []}, "prompt"),
        ({"prompt": ["a", "b" * 300_000]}, "prompt"), ({"prompt": [[1], [1, 10**9]]}, "prompt"),
        ({"n": 2, "seed": 2**63 - 1}, "seed"),
    ],
)  # fmt: skip
def test_fan_out_bounds_are_a_400_naming_the_field(
    rig: Rig, fields: dict[str, object], param: str
) -> None:
    body = {"model": "support", "prompt": "hi", "max_tokens": 2} | fields
    reply = rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert rig.engine.requests == []


def test_best_of_returns_the_highest_cumulative_logprob(rig: Rig) -> None:
    # Siblings get seeds 2, 3, 4: the fake scores seed 4 (4 % 4 == 0) highest.
    api = _api(rig)
    done = api.completions.create(model="support", prompt="hi", best_of=3, seed=2, max_tokens=2)
    assert len(rig.engine.requests) == 3
    assert {r.params.logprobs for r in rig.engine.requests} == {0}  # asked for internally
    assert [c.index for c in done.choices] == [0] and done.choices[0].logprobs is None
    done = api.completions.create(
        model="support", prompt="hi", best_of=3, n=2, seed=2, max_tokens=2, logprobs=0
    )
    winners = [rig.engine.requests[-1], rig.engine.requests[-3]]  # seeds 4, then 2
    assert [c.index for c in done.choices] == [0, 1]
    for choice, sibling in zip(done.choices, winners, strict=True):
        assert choice.logprobs is not None
        assert choice.logprobs.token_logprobs == [fake_logprob(sibling, c) for c in (1, 2)]
    assert done.usage is not None and done.usage.completion_tokens == 6  # all three generated


def test_streaming_n_interleaves_choices_and_sums_usage_once(rig: Rig) -> None:
    body = {
        "model": "support", "messages": [{"role": "user", "content": "hi"}], "n": 2,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    reply = rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("acme"))
    chunks = _events(reply.text)
    roles = [
        c["choices"][0]["index"]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("role")
    ]
    assert roles == [0, 1]
    for index in (0, 1):
        parts = [
            c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index
        ]
        assert "".join(p["delta"]["content"] or "" for p in parts) == REPLY
        assert parts[-1]["finish_reason"] == "stop"
    usage = [c["usage"] for c in chunks if c["usage"] is not None]
    prompt = len(rig.engine.requests[0].prompt_token_ids)
    assert usage == [{"prompt_tokens": prompt, "completion_tokens": 4, "total_tokens": prompt + 4}]


def _fails_sibling_1(request: EngineRequest) -> Exception | None:
    if request.request_id.endswith("-1"):
        return GenerationError(request.request_id, "non-finite logits")
    return None


@pytest.mark.parametrize("stream", [False, True])
def test_one_failing_sibling_fails_the_request_and_aborts_the_rest(
    served: Served, stream: bool
) -> None:
    async def scenario() -> tuple[httpx.Response, FakeEngine]:
        engine = FakeEngine(gate=asyncio.Event(), fail=_fails_sibling_1)
        deps = make_app_deps(served, engine)
        transport = httpx.ASGITransport(app=create_app(deps))
        body = {"model": "support", "prompt": "hi", "n": 3, "max_tokens": 4, "stream": stream}
        headers = {"Authorization": f"Bearer {served.keys['acme']}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            reply = await asyncio.wait_for(
                client.post("/v1/completions", json=body, headers=headers), 10
            )
        return reply, engine

    reply, engine = asyncio.run(scenario())
    ids = [r.request_id for r in engine.requests]
    if stream:  # the first delta was sent: the error is the stream's last event
        assert reply.status_code == 200
        assert _events(reply.text)[-1]["error"]["code"] == "generation_failed"
    else:
        assert reply.status_code == 422 and reply.json()["error"]["code"] == "generation_failed"
    assert {ids[0], ids[2]} <= set(engine.aborted)  # the healthy siblings stop at once


class StubRequest:
    """Receives nothing until ``leave()``, then a disconnect (what uvicorn does)."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}


def test_a_client_leaving_aborts_every_sibling(served: Served) -> None:
    async def scenario() -> list[str]:
        engine = FakeEngine(gate=asyncio.Event())
        members = [
            Sibling(f"r-{i}", i, engine.generate(EngineRequest(f"r-{i}", "acme", None, (1, 2),
                                                               SamplingParams(max_tokens=8))))
            for i in range(3)
        ]  # fmt: skip
        stub = StubRequest()
        task = asyncio.ensure_future(collect(cast(Request, stub), Fanout(engine, members), 3))
        await asyncio.sleep(0.05)
        assert not task.done() and engine.aborted == []
        stub.left.set()
        with pytest.raises(ClientDisconnectedError):
            await asyncio.wait_for(task, 5)
        return engine.aborted

    assert sorted(asyncio.run(scenario())) == ["r-0", "r-1", "r-2"]


def test_x_request_id_is_the_response_id_and_echoed(rig: Rig) -> None:
    headers = rig.headers("acme") | {"X-Request-Id": "trace-42"}
    body = {"model": "support", "prompt": "hi", "max_tokens": 2}
    reply = rig.client.post("/v1/completions", json=body, headers=headers)
    assert reply.json()["id"] == "trace-42" and reply.headers["x-request-id"] == "trace-42"
    assert rig.engine.requests[-1].request_id != "trace-42"
    plain = rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
    assert plain.headers["x-request-id"] == plain.json()["id"]
    stream = rig.client.post("/v1/completions", json=body | {"stream": True}, headers=headers)
    assert {c["id"] for c in _events(stream.text)} == {"trace-42"}
    assert stream.headers["x-request-id"] == "trace-42"


@pytest.mark.parametrize("value", ["x" * 129, "caf\u00e9".encode("latin-1"), "tab\there"])
def test_an_invalid_x_request_id_is_a_400_naming_the_header(rig: Rig, value: str | bytes) -> None:
    headers: dict[str, str | bytes] = {**rig.headers("acme"), "X-Request-Id": value}
    body = {"model": "support", "prompt": "hi", "max_tokens": 2}
    reply = rig.client.post("/v1/completions", json=body, headers=cast(Any, headers))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "X-Request-Id"


def test_two_tenants_sending_one_x_request_id_at_once_both_work(served: Served) -> None:
    async def scenario() -> tuple[list[httpx.Response], FakeEngine]:
        engine = FakeEngine(gate=asyncio.Event())
        transport = httpx.ASGITransport(app=create_app(make_app_deps(served, engine)))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def ask(tenant: str, model: str) -> httpx.Response:
                headers = {"Authorization": f"Bearer {served.keys[tenant]}", "X-Request-Id": "same"}
                body = {"model": model, "prompt": "hi", "max_tokens": 4}
                return await client.post("/v1/completions", json=body, headers=headers)

            tasks = [
                asyncio.ensure_future(ask("acme", "support")),
                asyncio.ensure_future(ask("globex", "search")),
            ]
            while len(engine.requests) < 2:  # both are generating at once
                await asyncio.sleep(0.01)
            assert engine.gate is not None
            engine.gate.set()
            return list(await asyncio.gather(*tasks)), engine

    replies, engine = asyncio.run(scenario())
    assert [r.status_code for r in replies] == [200, 200]
    assert [r.json()["id"] for r in replies] == ["same", "same"]
    assert [r.json()["choices"][0]["text"] for r in replies] == [
        REPLY,
        " globex/search@r1 answers.",
    ]
    ids = {r.request_id for r in engine.requests}
    assert len(ids) == 2 and "same" not in ids and engine.aborted == []


@pytest.mark.parametrize("fields", [{"n": 17}, {"prompt": ["a"] * 5, "n": 4}])
def test_a_fan_out_refusal_states_the_fixed_limit_not_a_setting(
    rig: Rig, fields: dict[str, object]
) -> None:
    """No setting is named ``max_choices``: the message gives the number and says it is fixed."""
    body = {"model": "support", "prompt": "hi", "max_tokens": 2} | fields
    reply = rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
    message = reply.json()["error"]["message"]
    assert "max_choices" not in message and "at most 16" in message and "fixed limit" in message
