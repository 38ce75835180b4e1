"""An error quoting the caller's JSON keys is still sent when a key holds a lone surrogate
(hostile tenant, attack round 16): ``json`` parses ``"\\ud800"`` to a code point UTF-8 cannot
hold, and the 400 naming such a key (given twice, or holding a too long integer) failed to
render, a 500 a tenant could cause at will."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Rig

from loraplex.server.errors import invalid_request

HEAD = b'{"model": "support", "prompt": "hi", '


def _post(rig: Rig, raw: bytes) -> Any:
    headers = {**rig.headers("acme"), "Content-Type": "application/json"}
    return rig.client.post("/v1/completions", content=raw, headers=headers)


@pytest.mark.parametrize(
    ("rest", "param"),
    [
        (b'"\\ud800": 1, "\\ud800": 2}', "\\ud800"),  # a key given twice
        (b'"logit_bias": {"\\ud800": 1, "\\ud800": 2}}', "\\ud800"),
        (b'"logit_bias": {"\\ud800": ' + b"9" * 5000 + b"}}", "logit_bias.\\ud800"),
    ],
)
def test_a_lone_surrogate_key_is_named_escaped_in_a_400(rig: Rig, rest: bytes, param: str) -> None:
    reply = _post(rig, HEAD + rest)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert "\\ud800" in error["message"], error
    assert rig.engine.requests == []


def test_an_error_body_escapes_lone_surrogates_only() -> None:
    error = invalid_request("key 'caf\u00e9\ud800' is wrong", "x.\udfff.\u00e9").body()["error"]
    assert error == {
        "message": "key 'caf\u00e9\\ud800' is wrong",
        "type": "invalid_request_error",
        "param": "x.\\udfff.\u00e9",
        "code": "invalid_request",
    }
