"""A chat stream's ``delta.content`` is always a string, as vLLM sends it: ``""`` on the role
chunk and on a delta without text (the finishing one of an EOS, which has no text of its own).
Before, such a delta sent ``"content": null``, a value neither OpenAI (``{}`` on its finishing
chunk) nor vLLM (``""``) sends. Checked on the raw events and through the openai client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from conftest import Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from openai import OpenAI

from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.server.app import create_app

EOS_ID = 2
REPLY = " initech/chat@r1 answers."
MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass
class EosEngine(FakeEngine):
    """The fake engine, each stream ending on an EOS token: a last delta with no text."""

    async def _stream(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        async for delta in super()._stream(request):
            if delta.finish_reason is None:
                yield delta
                continue
            yield replace(delta, finish_reason=None, stop_reason=None)
            yield TokenDelta(
                (EOS_ID,), "", "stop", delta.prompt_tokens, delta.completion_tokens + 1
            )


@pytest.fixture
def client(served: Served) -> Iterator[TestClient]:
    deps = make_app_deps(served, EosEngine())
    with TestClient(create_app(deps)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {served.keys['initech']}"
        yield test_client
    assert deps.cache is not None
    deps.cache.close()


def _deltas(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    events = [json.loads(line) for line in lines if line != "[DONE]"]
    return [choice["delta"] for event in events for choice in event["choices"]]


@pytest.mark.parametrize("n", [1, 2])
def test_every_delta_carries_a_string_content(client: TestClient, n: int) -> None:
    body = {"model": "chat", "messages": MESSAGES, "stream": True, "n": n}
    deltas = _deltas(client.post("/v1/chat/completions", json=body).text)
    assert deltas[:n] == [{"role": "assistant", "content": ""}] * n
    assert deltas[-1] == {"content": ""}  # the EOS: no text, no null
    assert all(isinstance(d.get("content"), str) for d in deltas), deltas
    assert "".join(d["content"] for d in deltas) == REPLY * n


def test_with_logprobs_the_eos_delta_still_has_a_string(client: TestClient) -> None:
    body = {"model": "chat", "messages": MESSAGES, "stream": True, "logprobs": True}
    deltas = _deltas(client.post("/v1/chat/completions", json=body).text)
    assert deltas[-1] == {"content": ""}


def test_the_openai_client_reads_strings_only(client: TestClient, served: Served) -> None:
    api = OpenAI(
        base_url="http://testserver/v1",
        api_key=served.keys["initech"],
        http_client=client,
        max_retries=0,
    )
    chunks = list(
        api.chat.completions.create(model="chat", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    )
    contents = [chunk.choices[0].delta.content for chunk in chunks if chunk.choices]
    assert all(isinstance(c, str) for c in contents), contents
    assert "".join(c or "" for c in contents) == REPLY
    assert chunks[-1].choices[0].finish_reason == "stop"
    with api.chat.completions.stream(model="chat", messages=MESSAGES) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    assert final.choices[0].message.content == REPLY
