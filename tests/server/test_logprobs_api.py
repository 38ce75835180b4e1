"""Sampling fields, logprobs, echo and the output budget over HTTP with the official openai
client against the app on the fake engine (its logprobs follow ``fakes.fake_logprob``)."""

from __future__ import annotations

import json
from typing import Any, cast

import openai
import pytest
from conftest import Rig, Served, make_app_deps
from fakes import BOS, FakeEngine, fake_logprob, on_event_loop
from fastapi.testclient import TestClient
from openai import OpenAI

from loraplex.residency.cache import TieredAdapterCache
from loraplex.sampling import DEFAULT_MAX_TOKENS
from loraplex.server import streaming
from loraplex.server.app import create_app
from loraplex.server.streaming import MAX_LOOP_LOGPROB_ENTRIES


def _api(rig: Rig, tenant: str = "acme") -> OpenAI:
    key = rig.served.keys[tenant]
    return OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=rig.client, max_retries=0
    )


def _events(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_sampling_fields_reach_the_engine(rig: Rig) -> None:
    _api(rig).completions.create(
        model="support", prompt="hi", max_tokens=4, presence_penalty=0.5, frequency_penalty=-1.0,
        logit_bias={"70": -100, "5": 2},
        extra_body={"repetition_penalty": 1.2, "min_p": 0.1, "stop_token_ids": [2, 9],
                    "include_stop_str_in_output": True},
    )  # fmt: skip
    params = rig.engine.requests[-1].params
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -1.0)
    assert (params.repetition_penalty, params.min_p) == (1.2, 0.1)
    assert params.logit_bias == ((5, 2.0), (70, -100.0))
    assert params.stop_token_ids == (2, 9) and params.include_stop_str_in_output
    assert params.logprobs is None and params.prompt_logprobs is None  # nothing extra asked


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5), ("frequency_penalty", -2.1), ("repetition_penalty", 0),
        ("min_p", 1.5), ("logit_bias", {"x": 1}), ("logit_bias", {"-3": 1}),
        ("logit_bias", {"99999999": 1}), ("logit_bias", {"5": 101}),
        ("stop_token_ids", [99999999]), ("stop_token_ids", [-1]), ("logprobs", 21),
        ("logprobs", -1), ("logprobs", True), ("n", 0), ("best_of", 0),
    ],
)  # fmt: skip
def test_out_of_range_values_are_a_400_naming_the_field(
    rig: Rig, field: str, value: object
) -> None:
    body = {"model": "support", "prompt": "hi", "max_tokens": 2, field: value}
    reply = rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field
    assert rig.engine.requests == []


def test_chat_top_logprobs_needs_logprobs(rig: Rig) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        _api(rig).chat.completions.create(
            model="support", messages=[{"role": "user", "content": "hi"}], top_logprobs=2
        )
    assert refused.value.body["param"] == "top_logprobs"  # type: ignore[index]


def test_completion_logprobs_in_the_legacy_shape(rig: Rig) -> None:
    done = _api(rig).completions.create(model="support", prompt="hi", max_tokens=4, logprobs=2)
    request = rig.engine.requests[-1]
    assert request.params.logprobs == 2 and request.params.prompt_logprobs is None
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.tokens == [chr(1), chr(2)]  # the fake's two token ids decoded alone
    assert logprobs.token_logprobs == [fake_logprob(request, c) for c in (1, 2)]
    assert logprobs.text_offset == [0, 1]
    assert logprobs.top_logprobs is not None
    lp = fake_logprob(request, 1)
    assert logprobs.top_logprobs[0] == {chr(1): lp, chr(2): lp - 1}


def test_chat_logprobs_in_the_chat_shape(rig: Rig) -> None:
    done = _api(rig).chat.completions.create(
        model="support", messages=[{"role": "user", "content": "hi"}], logprobs=True,
        top_logprobs=2, max_tokens=2,
    )  # fmt: skip
    request = rig.engine.requests[-1]
    content = done.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 2
    first = content[0]
    assert (first.token, first.logprob, first.bytes) == (chr(1), fake_logprob(request, 1), [1])
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [
        (chr(1), first.logprob), (chr(2), first.logprob - 1)
    ]  # fmt: skip
    plain = _api(rig).chat.completions.create(
        model="support", messages=[{"role": "user", "content": "hi"}], logprobs=True, max_tokens=1
    )
    only = plain.choices[0].logprobs
    assert only is not None and only.content is not None and only.content[0].top_logprobs == []


@pytest.mark.parametrize("chat", [False, True])
def test_stream_chunks_carry_their_tokens_logprobs(rig: Rig, chat: bool) -> None:
    body: dict[str, Any]
    if chat:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
        body |= {"logprobs": True, "top_logprobs": 1}
    else:
        path, body = "/v1/completions", {"prompt": "hi", "logprobs": 1}
    body |= {"model": "support", "max_tokens": 3, "stream": True}
    reply = rig.client.post(path, json=body, headers=rig.headers("acme"))
    chunks = [c["choices"][0] for c in _events(reply.text) if c["choices"]]
    with_logprobs = [c["logprobs"] for c in chunks if c["logprobs"] is not None]
    request = rig.engine.requests[-1]
    if chat:
        values = [e["logprob"] for lp in with_logprobs for e in lp["content"]]
    else:
        values = [v for lp in with_logprobs for v in lp["token_logprobs"]]
        assert [o for lp in with_logprobs for o in lp["text_offset"]] == [0, 1]
    assert values == [fake_logprob(request, c) for c in (1, 2)]
    assert chunks[-1]["finish_reason"] == "stop" and chunks[-1]["stop_reason"] is None


def test_echo_prepends_the_prompt_and_its_logprobs(rig: Rig) -> None:
    api = _api(rig)
    done = api.completions.create(model="support", prompt="hi", max_tokens=2, echo=True)
    assert done.choices[0].text == "hi acme/support@r1 answers."
    assert done.choices[0].logprobs is None
    done = api.completions.create(model="support", prompt="hi", max_tokens=1, echo=True, logprobs=1)
    request = rig.engine.requests[-1]
    assert request.params.prompt_logprobs == 1
    logprobs = done.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["<special:1>", "h", "i", chr(1)]  # BOS as itself (token_text)
    assert logprobs.token_logprobs == [None, -1.5, -2.0, fake_logprob(request, 1)]
    assert logprobs.top_logprobs is not None
    assert cast(list[object], logprobs.top_logprobs)[0] is None
    # Positions in the returned text, which holds no BOS: it advances the offset by nothing
    # (vLLM counts its shown string, which put every offset 11 characters past its token).
    assert logprobs.text_offset == [0, 0, 1, 2]
    text = done.choices[0].text  # the fake engine's text is not its tokens': the prompt's are
    assert [text[o : o + 1] for o in logprobs.text_offset[1:3]] == ["h", "i"]


_LOGPROB_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


def test_a_streamed_echo_is_the_answer_and_its_prompt_is_formatted_off_the_loop(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_loop: list[bool] = []  # per formatted event: whether an event loop runs on its thread
    real = streaming.completion_logprobs

    def recording(*args: Any, **kwargs: Any) -> Any:
        on_loop.append(on_event_loop())
        return real(*args, **kwargs)

    monkeypatch.setattr(streaming, "completion_logprobs", recording)
    prompt = "the acme support team " * 5  # 110 prompt tokens on the fake engine's tokenizer
    body = {"model": "support", "prompt": [prompt, prompt[::-1]], "echo": True, "logprobs": 5}
    body |= {"max_tokens": 3, "n": 2}
    answer = rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
    assert answer.status_code == 200, answer.text
    reply = rig.client.post(
        "/v1/completions", json=body | {"stream": True}, headers=rig.headers("acme")
    )
    assert reply.status_code == 200, reply.text
    streamed: dict[int, dict[str, Any]] = {}
    for chunk in _events(reply.text):
        for choice in chunk["choices"]:
            got = streamed.setdefault(
                choice["index"], {"text": ""} | {k: [] for k in _LOGPROB_KEYS}
            )
            got["text"] += choice["text"]
            for key in _LOGPROB_KEYS if choice["logprobs"] is not None else ():
                got[key] += choice["logprobs"][key]
    expected = {c["index"]: {"text": c["text"], **c["logprobs"]} for c in answer.json()["choices"]}
    assert streamed == expected  # the same text, tokens, logprobs, top logprobs and offsets
    assert sorted(expected) == [0, 1, 2, 3]
    assert all(len(c["tokens"]) > MAX_LOOP_LOGPROB_ENTRIES + 3 for c in expected.values())
    # each choice's first event (its echoed prompt) off the loop; a generated token's on it
    assert on_loop.count(False) == 4 and on_loop.count(True) >= 4, on_loop


def test_echo_with_zero_max_tokens_returns_only_the_prompt(rig: Rig) -> None:
    """The loglikelihood request of evaluation harnesses."""
    done = _api(rig).completions.create(
        model="support", prompt=[BOS, 107, 108], max_tokens=0, echo=True, logprobs=0,
        temperature=0,
    )  # fmt: skip
    assert rig.engine.requests[-1].params.max_tokens == 1  # asked for one, never shown
    choice = done.choices[0]
    assert choice.text == "hi" and choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs == [None, -1.5, -2.0]
    assert done.usage is not None and done.usage.completion_tokens == 0
    reply = rig.client.post(
        "/v1/completions", json={"model": "support", "prompt": "hi", "max_tokens": 0},
        headers=rig.headers("acme"),
    )  # fmt: skip
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"


def test_a_negative_max_tokens_is_refused_saying_what_is_allowed(rig: Rig) -> None:
    # It said "greater than or equal to 0", and 0 was then refused without echo.
    reply = rig.client.post(
        "/v1/completions", json={"model": "support", "prompt": "hi", "max_tokens": -1},
        headers=rig.headers("acme"),
    )  # fmt: skip
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == "max_tokens", error
    assert "max_tokens" in error["message"] and "-1" in error["message"], error
    assert "expected >= 1, or 0 with echo true" in error["message"], error
    assert "greater than or equal to 0" not in error["message"], error
    assert rig.engine.requests == []  # refused before it cost anything


def test_stop_reason_names_the_stop_token(rig: Rig) -> None:
    done = _api(rig).completions.create(
        model="support", prompt="hi", max_tokens=9, extra_body={"stop_token_ids": [9]}
    )
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].model_extra == {"stop_reason": 9}


@pytest.fixture
def bounded(served: Served) -> Any:
    """An app that knows the context length (48 tokens)."""
    engine = FakeEngine()
    deps = make_app_deps(served, engine, max_prompt_tokens=47, max_model_len=48)
    with TestClient(create_app(deps)) as client:
        yield client, engine, {"Authorization": f"Bearer {served.keys['acme']}"}
    cast(TieredAdapterCache, deps.cache).close()


def test_max_tokens_beyond_the_context_is_a_400_with_both_numbers(bounded: Any) -> None:
    client, engine, headers = bounded
    body = {"model": "support", "prompt": "x" * 9, "max_tokens": 39}  # 10 + 39 > 48
    reply = client.post("/v1/completions", json=body, headers=headers)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == "max_tokens"
    assert error["code"] == "context_length_exceeded" and "48" in error["message"]
    assert "49" in error["message"] and engine.requests == []
    body["max_tokens"] = 38
    assert client.post("/v1/completions", json=body, headers=headers).status_code == 200
    chat = {"model": "support", "messages": [{"role": "user", "content": "x"}]}
    reply = client.post(
        "/v1/chat/completions", json=chat | {"max_completion_tokens": 48}, headers=headers
    )
    assert reply.json()["error"]["param"] == "max_completion_tokens"


def test_chat_max_tokens_defaults_to_the_rest_of_the_context(bounded: Any) -> None:
    client, engine, headers = bounded
    chat = {"model": "support", "messages": [{"role": "user", "content": "x"}]}
    assert client.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200
    request = engine.requests[-1]
    assert request.params.max_tokens == 48 - len(request.prompt_token_ids)


def test_min_tokens_is_checked_against_the_budget_decided_from_the_prompt(
    bounded: Any,
) -> None:
    """Issue 26: the parameters are built once, after the prompt is encoded, with its budget
    (no placeholder replaced later): chat's default budget is the rest of the context, and a
    min_tokens beyond it is a 400 naming min_tokens; nothing reaches the engine."""
    client, engine, headers = bounded
    chat = {"model": "support", "messages": [{"role": "user", "content": "x"}]}
    assert client.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200
    rest = engine.requests[-1].params.max_tokens
    fits = client.post("/v1/chat/completions", json=chat | {"min_tokens": rest}, headers=headers)
    assert fits.status_code == 200 and engine.requests[-1].params.min_tokens == rest
    sent = len(engine.requests)
    reply = client.post(
        "/v1/chat/completions", json=chat | {"min_tokens": rest + 1}, headers=headers
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "min_tokens"
    assert len(engine.requests) == sent


def test_a_bad_sampling_field_is_refused_before_the_prompt_is_encoded(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine()
    encoded: list[str] = []
    original = engine.tokenizer.encode

    def counting(text: str, *args: Any, **kwargs: Any) -> Any:
        encoded.append(text)
        return original(text, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", counting)
    deps = make_app_deps(served, engine)
    try:
        with TestClient(create_app(deps)) as client:
            headers = {"Authorization": f"Bearer {served.keys['acme']}"}
            body = {"model": "support", "prompt": "hello", "temperature": -1}
            reply = client.post("/v1/completions", json=body, headers=headers)
            assert reply.status_code == 400 and reply.json()["error"]["param"] == "temperature"
            assert encoded == [] and engine.requests == []
            ok = client.post("/v1/completions", json={**body, "temperature": 0}, headers=headers)
            assert ok.status_code == 200 and encoded == ["hello"]
            # no context length known here: a chat without a budget gets DEFAULT_MAX_TOKENS
            chat = {"model": "support", "messages": [{"role": "user", "content": "x"}]}
            assert client.post("/v1/chat/completions", json=chat, headers=headers).is_success
            assert engine.requests[-1].params.max_tokens == DEFAULT_MAX_TOKENS == 16
    finally:
        cast(TieredAdapterCache, deps.cache).close()
