"""Prompt lengths are refused before any per-token work: a token-id prompt that cannot fit in
the context is a 400 ``context_length_exceeded`` before the schema checks its ids one by one and
before the route checks them against the vocabulary (both counted here), and a text prompt past
``max_prompt_chars`` before the schema reads it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient

from loraplex.residency.cache import TieredAdapterCache
from loraplex.server import prompts, routes_tokenize
from loraplex.server.app import create_app
from loraplex.server.json_route import INLINE_JSON_BYTES
from loraplex.server.protocol import MAX_BATCH_PROMPTS
from loraplex.server.protocol import completions as protocol  # its prompt check

MAX_MODEL_LEN = 64
MAX_PROMPT_CHARS = 200


@dataclass
class Counted:
    client: TestClient
    served: Served
    engine: FakeEngine
    calls: list[str]  # per-prompt checks that walk every id: "schema" / "vocabulary"

    def post(self, **body: Any) -> Any:
        auth = {"Authorization": f"Bearer {self.served.keys['acme']}"}
        return self.client.post("/v1/completions", json={"model": "support", **body}, headers=auth)


@pytest.fixture
def counted(served: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    engine = FakeEngine()
    deps = make_app_deps(
        served, engine, max_model_len=MAX_MODEL_LEN, max_prompt_chars=MAX_PROMPT_CHARS
    )
    calls: list[str] = []
    token_ids, prompt_ids = protocol._token_ids, prompts._prompt_ids

    def counted_token_ids(value: object) -> object:
        calls.append("schema")
        return token_ids(value)

    def counted_prompt_ids(deps: Any, prompt: Any) -> list[int]:
        calls.append("vocabulary")
        return prompt_ids(deps, prompt)

    monkeypatch.setattr(protocol, "_token_ids", counted_token_ids)
    monkeypatch.setattr(prompts, "_prompt_ids", counted_prompt_ids)
    with TestClient(create_app(deps)) as client:
        yield Counted(client, served, engine, calls)
    assert isinstance(deps.cache, TieredAdapterCache)
    deps.cache.close()


def _error(reply: Any) -> dict[str, Any]:
    assert reply.status_code == 400, reply.text
    error: dict[str, Any] = reply.json()["error"]
    return error


def test_a_batch_of_huge_token_id_prompts_is_refused_before_any_id_is_checked(
    counted: Counted,
) -> None:
    huge = [[5] * 4096] * MAX_BATCH_PROMPTS
    error = _error(counted.post(prompt=huge, max_tokens=1))
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert f"maximum context length is {MAX_MODEL_LEN}" in error["message"]
    assert "prompt 0 has 4096 token ids" in error["message"]
    assert counted.calls == [] and counted.engine.requests == []


def test_the_length_is_refused_before_a_bad_id_is_found(counted: Counted) -> None:
    """The order shows: a too-long prompt with a bad id at its end is refused for its length."""
    error = _error(counted.post(prompt=[5] * MAX_MODEL_LEN + [-1]))
    assert error["code"] == "context_length_exceeded"
    assert "the prompt has 65 token ids" in error["message"]
    assert counted.calls == []


def test_a_large_body_is_refused_for_its_length_before_it_is_validated(counted: Counted) -> None:
    """A body over 64 KiB is validated where it is parsed, off the event loop
    (``json_route.parse_and_validate``): the route's length checks run there first."""
    prompt = [5] * (INLINE_JSON_BYTES // 2) + [-1]
    error = _error(counted.post(prompt=prompt))
    assert error["code"] == "context_length_exceeded", error
    assert f"the prompt has {len(prompt)} token ids" in error["message"]
    assert counted.calls == []
    auth = {"Authorization": f"Bearer {counted.served.keys['acme']}"}
    reply = counted.client.post(
        "/detokenize", json={"model": "support", "tokens": prompt}, headers=auth
    )
    assert (
        _error(reply)["param"] == "tokens" and f"has {len(prompt)} ids" in _error(reply)["message"]
    )


def test_the_one_long_prompt_of_a_batch_is_named(counted: Counted) -> None:
    batch = [[5] * 4, [5] * 4, [5] * MAX_MODEL_LEN]
    error = _error(counted.post(prompt=batch))
    assert "prompt 2 has 64 token ids" in error["message"] and counted.calls == []


def test_a_prompt_that_leaves_room_for_one_token_is_served(counted: Counted) -> None:
    reply = counted.post(prompt=[5] * (MAX_MODEL_LEN - 1), max_tokens=1)
    assert reply.status_code == 200, reply.text
    assert counted.calls == ["schema", "vocabulary"]  # the counters count: the checks ran
    counted.calls.clear()
    assert counted.post(prompt=[[5] * 3, [6] * 3], max_tokens=1).status_code == 200
    assert counted.calls.count("vocabulary") == 2


def test_a_text_prompt_past_the_character_cap_is_refused_before_anything_reads_it(
    counted: Counted,
) -> None:
    error = _error(counted.post(prompt=["fine", "x" * (MAX_PROMPT_CHARS + 1)]))
    assert error["param"] == "prompt" and f"at most {MAX_PROMPT_CHARS}" in error["message"]
    assert counted.calls == [] and counted.engine.requests == []


def test_a_body_without_content_type_is_json_and_its_length_checked_first(
    counted: Counted,
) -> None:
    """The app reads a body without Content-Type as JSON (as vLLM); its prompt's length is
    refused before the schema walks the ids, like any JSON body's."""
    auth = {"Authorization": f"Bearer {counted.served.keys['acme']}"}
    prompt = ",".join(["5"] * MAX_MODEL_LEN)
    body = f'{{"model": "support", "prompt": [{prompt}]}}'.encode()
    reply = counted.client.post("/v1/completions", content=body, headers=auth)
    assert reply.status_code == 400 and _error(reply)["code"] == "context_length_exceeded"
    assert counted.calls == [] and counted.engine.requests == []


def test_another_declared_content_type_is_refused_before_the_schema(counted: Counted) -> None:
    auth = {"Authorization": f"Bearer {counted.served.keys['acme']}", "Content-Type": "text/plain"}
    reply = counted.client.post(
        "/v1/completions", content=b'{"model": "support", "prompt": [5]}', headers=auth
    )
    assert reply.status_code == 400 and _error(reply)["param"] == "Content-Type"
    assert counted.engine.requests == []


def test_detokenize_refuses_more_ids_than_the_context_before_walking_them(
    counted: Counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[int] = []
    check_ids = routes_tokenize._check_ids

    def counted_check_ids(deps: Any, ids: list[int]) -> None:
        checked.append(len(ids))
        check_ids(deps, ids)

    monkeypatch.setattr(routes_tokenize, "_check_ids", counted_check_ids)
    auth = {"Authorization": f"Bearer {counted.served.keys['acme']}"}
    long = [5] * MAX_MODEL_LEN + ["not an id"]  # the schema would stop at the bad item
    error = _error(counted.client.post("/detokenize", json={"tokens": long}, headers=auth))
    assert (
        error["param"] == "tokens"
        and f"65 ids; expected at most {MAX_MODEL_LEN}" in (error["message"])
    )
    assert checked == []
    fits = counted.client.post("/detokenize", json={"tokens": [5] * MAX_MODEL_LEN}, headers=auth)
    assert fits.status_code == 200, fits.text
    assert checked == [MAX_MODEL_LEN]


def test_a_batch_stops_tokenizing_at_its_first_text_prompt_that_cannot_fit(
    counted: Counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text prompt's tokens are known only once it is tokenized; every prompt of a batch was,
    before the context check refused the first: sixteen refused prompts of ``max_prompt_chars``
    each cost sixteen encodes for one 400 (docs/operations.md: 0.218 s against 0.016 s per
    request on the demo model)."""
    encoded: list[int] = []
    encode = counted.engine.char_tokenizer.encode

    def counted_encode(text: str) -> list[int]:
        encoded.append(len(text))
        return encode(text)

    monkeypatch.setattr(counted.engine.char_tokenizer, "encode", counted_encode)
    long = "x" * MAX_MODEL_LEN  # within max_prompt_chars; with BOS one token past the context
    error = _error(counted.post(prompt=["fits", long, *[long] * (MAX_BATCH_PROMPTS - 2)]))
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert f"prompt 1 has {MAX_MODEL_LEN + 1} token ids" in error["message"]
    assert encoded == [4, MAX_MODEL_LEN] and counted.engine.requests == []
    error = _error(counted.post(prompt=long))
    assert f"the prompt has {MAX_MODEL_LEN + 1} token ids" in error["message"]


def test_a_conversation_too_long_by_itself_is_a_400_naming_messages_not_max_tokens(
    counted: Counted,
) -> None:
    """A rendered conversation that leaves no room in the context is refused as a text prompt
    is, naming ``messages``: with an explicit ``max_tokens`` the 400 named ``max_tokens`` and
    said to reduce it, where no ``max_tokens`` could help (vLLM names the prompt's tokens;
    docs/benchmarks/vllmdiff.md)."""
    auth = {"Authorization": f"Bearer {counted.served.keys['acme']}"}
    long = [{"role": "user", "content": "x" * MAX_MODEL_LEN}]  # far past the context
    for extra in ({"max_tokens": 4}, {"max_completion_tokens": 4}, {}):
        body = {"model": "support", "messages": long, **extra}
        error = _error(counted.client.post("/v1/chat/completions", json=body, headers=auth))
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages"), extra
        assert "reduce the prompt" in error["message"]
    assert counted.engine.requests == []
    short = [{"role": "user", "content": "hi"}]
    body = {"model": "support", "messages": short, "max_tokens": MAX_MODEL_LEN}
    error = _error(counted.client.post("/v1/chat/completions", json=body, headers=auth))
    assert error["param"] == "max_tokens"  # a prompt that fits: the output budget is too large


def test_an_empty_text_prompt_is_served_as_bos_alone(counted: Counted) -> None:
    """``prompt: ""`` is the tokenizer's BOS alone, as OpenAI serves an empty prompt (vLLM
    0.32.0 answers a 400; docs/migrating-from-vllm.md); an empty batch is a 400."""
    reply = counted.post(prompt="", max_tokens=1)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == 1
    assert len(counted.engine.requests[-1].prompt_token_ids) == 1
    assert _error(counted.post(prompt=[]))["param"] == "prompt"
