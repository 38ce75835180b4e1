"""Nothing a tenant sends is silently ignored: unknown fields are a 400 naming them, known but
unimplemented fields are accepted only at the value that changes nothing, and implemented fields
reach the sampler."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import Rig, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient

from loraplex.server.app import create_app
from loraplex.server.chat import ChatTemplate
from loraplex.server.protocol import NEUTRAL

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
_CHAT_ONLY = {"tools", "tool_choice", "response_format", "add_generation_prompt"} | {
    "parallel_tool_calls", "store", "metadata", "service_tier",
}  # fmt: skip
_COMPLETIONS_ONLY = {"suffix"}


def _body(path: str, **fields: Any) -> dict[str, Any]:
    prompt: dict[str, Any] = (
        {"prompt": "hi"}
        if path == COMPLETIONS
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    return {"model": "support", "max_tokens": 4, **prompt, **fields}


def _paths(field: str) -> list[str]:
    if field in _CHAT_ONLY:
        return [CHAT]
    if field in _COMPLETIONS_ONLY:
        return [COMPLETIONS]
    return [COMPLETIONS, CHAT]


NEUTRAL_CASES = [(f, v, p) for f, values in NEUTRAL.items() for v in values for p in _paths(f)]
REFUSED_CASES = [
    ("suffix", "end"),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "auto"),
    ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    ("add_generation_prompt", False),
    ("store", True),
    ("metadata", {"run": "a"}),
    ("service_tier", "flex"),
    ("service_tier", "priority"),
]


def test_neutral_lists_only_what_is_not_implemented() -> None:
    assert set(NEUTRAL) == {"suffix", "tools", "tool_choice", "response_format"} | {
        "add_generation_prompt", "parallel_tool_calls", "store", "metadata", "service_tier"
    }  # fmt: skip


@pytest.mark.parametrize(("field", "value", "path"), NEUTRAL_CASES)
def test_an_unimplemented_field_at_its_neutral_value_is_accepted(
    rig: Rig, field: str, value: object, path: str
) -> None:
    reply = rig.client.post(path, json=_body(path, **{field: value}), headers=rig.headers("acme"))
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("field", "value", "path"), [(f, v, p) for f, v in REFUSED_CASES for p in _paths(f)]
)
def test_an_unimplemented_field_that_would_change_the_output_is_refused(
    rig: Rig, field: str, value: object, path: str
) -> None:
    before = len(rig.engine.requests)
    reply = rig.client.post(path, json=_body(path, **{field: value}), headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field
    assert len(rig.engine.requests) == before  # refused before the engine saw it


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("field", ["nonsense_field", "guided_json", "temprature"])
def test_an_unknown_field_is_a_400_naming_it(rig: Rig, path: str, field: str) -> None:
    reply = rig.client.post(path, json=_body(path, **{field: 1}), headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field


@pytest.mark.parametrize(
    ("field", "path"), [("best_of", CHAT), ("echo", CHAT), ("top_logprobs", COMPLETIONS)]
)
def test_a_field_of_the_other_endpoint_is_a_400_naming_it(rig: Rig, field: str, path: str) -> None:
    reply = rig.client.post(path, json=_body(path, **{field: 1}), headers=rig.headers("acme"))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == field


def test_unknown_fields_inside_messages_and_stream_options_are_refused(rig: Rig) -> None:
    message = {"role": "user", "content": "hi", "audio": {"id": "x"}}
    body = {"model": "support", "messages": [message]}
    reply = rig.client.post(CHAT, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages.0.audio"
    body = _body(COMPLETIONS, stream=True, stream_options={"include_usage": True, "x": 1})
    reply = rig.client.post(COMPLETIONS, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stream_options.x"


def test_stream_options_without_stream_is_refused(rig: Rig) -> None:
    body = _body(COMPLETIONS, stream_options={"include_usage": True})
    reply = rig.client.post(COMPLETIONS, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stream_options"


def test_chat_max_tokens_beside_a_different_max_completion_tokens_is_refused(rig: Rig) -> None:
    """``max_completion_tokens`` wins (vLLM's rule); a different ``max_tokens`` beside it was
    dropped in silence. Both the same, or either alone, pass."""
    differ = _body(CHAT, max_completion_tokens=3)  # beside max_tokens 4
    reply = rig.client.post(CHAT, json=differ, headers=rig.headers("acme"))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"
    for fields in ({"max_completion_tokens": 3, "max_tokens": 3}, {"max_completion_tokens": 3}):
        body = _body(CHAT, **fields) | ({} if "max_tokens" in fields else {"max_tokens": None})
        reply = rig.client.post(CHAT, json=body, headers=rig.headers("acme"))
        assert reply.status_code == 200, reply.text
        assert rig.engine.requests[-1].params.max_tokens == 3


@pytest.mark.parametrize(("value", "expected"), [(None, None), (-1, None), (0, None), (3, 3)])
def test_top_k_reaches_the_sampler(rig: Rig, value: int | None, expected: int | None) -> None:
    reply = rig.client.post(
        COMPLETIONS, json=_body(COMPLETIONS, top_k=value), headers=rig.headers("acme")
    )
    assert reply.status_code == 200, reply.text
    assert rig.engine.requests[-1].params.top_k == expected


def test_top_k_below_minus_one_is_refused(rig: Rig) -> None:
    reply = rig.client.post(
        COMPLETIONS, json=_body(COMPLETIONS, top_k=-2), headers=rig.headers("acme")
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "top_k"


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_null_sampling_fields_mean_their_defaults(rig: Rig, path: str) -> None:
    nulls = dict.fromkeys(
        ("n", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
    ) | dict.fromkeys(("logit_bias", "stop_token_ids", "include_stop_str_in_output", "logprobs"))
    reply = rig.client.post(path, json=_body(path, **nulls), headers=rig.headers("acme"))
    assert reply.status_code == 200, reply.text
    params = rig.engine.requests[-1].params
    assert (params.presence_penalty, params.frequency_penalty) == (0.0, 0.0)
    assert (params.repetition_penalty, params.min_p, params.logprobs) == (1.0, 0.0, None)
    assert params.logit_bias == () and params.stop_token_ids == ()


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("value", [True, False])
def test_include_obfuscation_is_a_400_naming_it(rig: Rig, path: str, value: bool) -> None:
    """OpenAI's chunk padding (vLLM ignores it): loraplex pads no chunks and says so."""
    options = {"include_usage": True, "include_obfuscation": value}
    body = _body(path, stream=True, stream_options=options)
    reply = rig.client.post(path, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "stream_options.include_obfuscation"


def test_reasoning_effort_reaches_the_chat_template(served: Served) -> None:
    engine = FakeEngine()
    template = ChatTemplate(
        "{{ messages[0].content }} effort {{ reasoning_effort | default('-') }}"
    )
    deps = replace(make_app_deps(served, engine), chat=template)
    headers = {"Authorization": f"Bearer {served.keys['acme']}"}
    with TestClient(create_app(deps)) as client:
        for effort in ("high", None):
            body = _body(CHAT) | ({"reasoning_effort": effort} if effort else {})
            assert client.post(CHAT, json=body, headers=headers).status_code == 200
        refused = client.post(CHAT, json=_body(CHAT, reasoning_effort="lots"), headers=headers)
    assert deps.cache is not None
    deps.cache.close()
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "reasoning_effort"
    prompts = [engine.tokenizer.decode(r.prompt_token_ids) for r in engine.requests]
    assert prompts == ["hi effort high", "hi effort -"]
