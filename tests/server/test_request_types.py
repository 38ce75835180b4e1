"""Every tenant field takes only its JSON type: a number is never read from a string, ``true`` is
not a number and ``0`` / ``1`` are not booleans (pydantic's lax mode converted them, so
``"max_tokens": true`` asked for 1 token and ``"temperature": "0.5"`` sampled at 0.5, while
``n``, ``best_of`` and token ids already refused them). An integer is still a valid float."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Rig

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
TOKENIZE = "/tokenize"
_BASE: dict[str, dict[str, Any]] = {
    COMPLETIONS: {"model": "support", "prompt": "hi", "max_tokens": 2},
    CHAT: {"model": "support", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    TOKENIZE: {"model": "support", "prompt": "hi"},
}
_WRONG: list[tuple[str, str, object]] = [
    (COMPLETIONS, "max_tokens", True),
    (COMPLETIONS, "max_tokens", "2"),
    (COMPLETIONS, "max_tokens", 2.0),
    (COMPLETIONS, "seed", True),
    (COMPLETIONS, "seed", "7"),
    (COMPLETIONS, "min_tokens", True),
    (COMPLETIONS, "top_k", True),
    (COMPLETIONS, "top_k", "5"),
    (COMPLETIONS, "temperature", True),
    (COMPLETIONS, "temperature", "0.5"),
    (COMPLETIONS, "top_p", "1"),
    (COMPLETIONS, "presence_penalty", True),
    (COMPLETIONS, "frequency_penalty", "1"),
    (COMPLETIONS, "repetition_penalty", "1.1"),
    (COMPLETIONS, "min_p", False),
    (COMPLETIONS, "stream", 1),
    (COMPLETIONS, "stream", "false"),
    (COMPLETIONS, "echo", "true"),
    (COMPLETIONS, "ignore_eos", 1),
    (COMPLETIONS, "include_stop_str_in_output", "yes"),
    (CHAT, "max_completion_tokens", True),
    (CHAT, "logprobs", 1),
    (CHAT, "logprobs", "true"),
    (CHAT, "parallel_tool_calls", "yes"),
    (CHAT, "store", 0),
    (CHAT, "add_generation_prompt", 1),
    (TOKENIZE, "add_special_tokens", 1),
    (TOKENIZE, "return_token_strs", "true"),
]


@pytest.mark.parametrize(("path", "field", "value"), _WRONG)
def test_a_value_of_another_json_type_is_a_400_naming_its_field(
    rig: Rig, path: str, field: str, value: object
) -> None:
    reply = rig.client.post(path, json={**_BASE[path], field: value}, headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field
    assert not rig.engine.requests  # refused before the engine saw anything


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"5": True}),
        ("logit_bias", {"5": "1"}),
        ("stream_options", {"include_usage": 1}),
    ],
)
def test_a_nested_value_of_another_json_type_is_a_400(rig: Rig, field: str, value: object) -> None:
    body = {**_BASE[COMPLETIONS], "stream": True, field: value}
    reply = rig.client.post(COMPLETIONS, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"].startswith(field)
    assert not rig.engine.requests


def test_integers_are_still_numbers_and_booleans_still_booleans(rig: Rig) -> None:
    body = {**_BASE[COMPLETIONS], "temperature": 0, "top_p": 1, "presence_penalty": 1,
            "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0, "logit_bias": {"5": 1},
            "seed": 7, "top_k": 5, "min_tokens": 1, "echo": True, "ignore_eos": False,
            "include_stop_str_in_output": True}  # fmt: skip
    reply = rig.client.post(COMPLETIONS, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 200, reply.text
    params = rig.engine.requests[-1].params
    assert (params.temperature, params.top_p, params.seed, params.top_k) == (0.0, 1.0, 7, 5)
    assert params.logit_bias == ((5, 1.0),)
    chat = {**_BASE[CHAT], "logprobs": True, "top_logprobs": 2, "store": False,
            "parallel_tool_calls": True, "max_completion_tokens": 2}  # fmt: skip
    assert rig.client.post(CHAT, json=chat, headers=rig.headers("acme")).status_code == 200
