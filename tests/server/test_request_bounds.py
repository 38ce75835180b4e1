"""Tenant-controlled request values are range-checked before they cost anything (a 400
naming the field), and lone surrogates are a 400, not a 500."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Rig


def _post(rig: Rig, path: str, **body: Any) -> Any:
    return rig.client.post(path, json=body, headers=rig.headers("acme"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("temperature", 2.5),
        ("temperature", -1e-38),
        ("top_p", 0.0),
        ("top_p", 1.0000001),
        ("stop", "x" * 1025),
    ],
)
def test_out_of_range_sampling_values_are_a_400_naming_the_field(
    rig: Rig, field: str, value: float
) -> None:
    reply = _post(rig, "/v1/completions", model="support", prompt="hi", **{field: value})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field
    assert not rig.engine.requests  # refused before the engine saw anything


def test_extreme_but_valid_values_are_accepted(rig: Rig) -> None:
    body = {"model": "support", "prompt": "hi", "seed": 2**63 - 1, "temperature": 1e-38,
            "top_p": 1e-46}  # fmt: skip
    assert _post(rig, "/v1/completions", **body).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "bad \ud800 text"}, "prompt"),
        ("/v1/completions", {"prompt": ["fine", "bad \udfff"]}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "stop": "\ud800"}, "stop"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud83d"}]},
         "messages"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
         "messages"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400(rig: Rig, path: str, body: dict[str, Any], param: str) -> None:
    reply = rig.client.post(
        path,
        content=_json_with_surrogates({"model": "support", **body}),
        headers={**rig.headers("acme"), "content-type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"].split(".")[0] == param
    assert "surrogate" in reply.json()["error"]["message"]


def _json_with_surrogates(body: dict[str, Any]) -> bytes:
    """JSON text with ``\\uXXXX`` escapes for lone surrogates (what an attacker sends)."""
    import json

    return json.dumps(body, ensure_ascii=True).encode("ascii")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"max_tokens": 5, "min_tokens": 10}, "min_tokens"),
    ],
)
def test_values_checked_together_still_name_their_field(
    rig: Rig, fields: dict[str, Any], param: str
) -> None:
    reply = _post(rig, "/v1/completions", model="support", prompt="hi", **fields)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert not rig.engine.requests


def test_malformed_json_is_a_400_that_names_no_field(rig: Rig) -> None:
    reply = rig.client.post(
        "/v1/completions",
        content=b'{"model": "support", "prompt": "hi"',
        headers={**rig.headers("acme"), "Content-Type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] is None and error["message"].startswith("body is not valid JSON")


def test_a_body_that_is_not_utf8_is_a_400_with_a_code(rig: Rig) -> None:
    reply = rig.client.post(
        "/v1/completions",
        content=b'\xff\xfe{"model": "support"}',
        headers={**rig.headers("acme"), "Content-Type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("stop", ["x" * 5000, ["ok", "x" * 5000]])
def test_a_long_stop_string_is_counted_in_characters(rig: Rig, stop: object) -> None:
    """It said "Value should have at most 1024 items" (a length check pydantic put after the
    Unicode check, counting items)."""
    reply = _post(rig, "/v1/completions", model="support", prompt="hi", stop=stop)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"].split(".")[0] == "stop"
    assert "at most 1024 characters" in error["message"] and "items" not in error["message"]


HI = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "hi", "user": "u" * 257}, "user"),
        ("/v1/chat/completions", {"messages": [HI], "user": "u" * 257}, "user"),
        ("/v1/chat/completions", {"messages": [{**HI, "name": "n" * 257}]}, "messages.0.name"),
    ],
)
def test_a_long_user_or_name_is_counted_in_characters(
    rig: Rig, path: str, body: dict[str, object], param: str
) -> None:
    """They said "Value should have at most 256 items" (as ``stop`` did, above)."""
    reply = _post(rig, path, model="support", **body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert "at most 256 characters" in error["message"] and "items" not in error["message"]


@pytest.mark.parametrize("stop", ["\ud800", ["ok", "ab\udfff"], "x" * 5000 + "\ud800"])
def test_a_lone_surrogate_in_stop_keeps_its_message(rig: Rig, stop: object) -> None:
    """Checking the length in the str schema first made it pydantic's "unable to parse raw data
    as a unicode string"; the surrogate check runs before that schema reads the text."""
    reply = rig.client.post(
        "/v1/completions",
        content=_json_with_surrogates({"model": "support", "prompt": "hi", "stop": stop}),
        headers={**rig.headers("acme"), "content-type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"].split(".")[0] == "stop"
    assert "lone surrogate; expected valid Unicode text" in error["message"], error
    assert not rig.engine.requests


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/completions", {"prompt": "hi", "stop": list("abcde")},
         "stop: has 5 stop strings; expected at most 4"),
        ("/v1/completions", {"prompt": [[5, -2]]},
         "prompt: prompt 0 item 1 is -2; expected a token id >= 0"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 17}]},
         "messages.0.content: has 17 text parts; expected at most 16"),
    ],
)  # fmt: skip
def test_a_check_of_our_own_is_told_in_its_own_words(
    rig: Rig, path: str, body: dict[str, Any], message: str
) -> None:
    """pydantic words a validator's ``ValueError`` as "Value error, " + its text, and the
    tenant was shown that prefix (``stop: Value error, has 5 stop strings; ...``)."""
    reply = _post(rig, path, model="support", **body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == message
    assert not rig.engine.requests


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (["hi", [5, 6]], "item 0 is text, item 1 token ids"),
        ([[5, 6], "hi"], "item 1 is text, item 0 token ids"),
        (["hi", 5], "item 0 is text, item 1 a token id"),
        ([5, "hi"], "item 1 is text, item 0 a token id"),
    ],
)
def test_a_batch_mixing_text_and_token_ids_is_refused_as_a_mix(
    rig: Rig, prompt: list[object], message: str
) -> None:
    """It was refused for its text alone ("item 0 is a str; expected a token id >= 0", the
    token-id member's error), as if text prompts were not taken (docs/benchmarks/vllmdiff.md)."""
    reply = _post(rig, "/v1/completions", model="support", prompt=prompt)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "prompt"
    assert error["message"] == (
        f"prompt: mixes text and token ids ({message}); expected every item text, or every "
        "item token ids"
    )
    assert not rig.engine.requests


@pytest.mark.parametrize(("prompt", "shown"), [(["hi", None], "NoneType"), (["a", 1.5], "float")])
def test_a_text_batch_with_an_item_that_is_not_text_names_that_item(
    rig: Rig, prompt: list[object], shown: str
) -> None:
    """It was refused as "item 0 is a str; expected a token id >= 0", naming a good item."""
    reply = _post(rig, "/v1/completions", model="support", prompt=prompt)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "prompt"
    assert error["message"] == f"prompt: item 1 is a {shown}; expected text"
