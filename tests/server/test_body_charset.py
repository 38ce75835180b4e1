"""A tenant's JSON body is UTF-8 (RFC 8259 §8.1), a 400 naming ``Content-Type`` otherwise
(hostile tenant, attack round 16).

``json.loads`` read a body in UTF-16 or UTF-32 as well, and FastAPI ignored a declared
``charset``: a gateway reading the body as JSON to check ``model`` or ``max_tokens`` found no
JSON in a UTF-16 body, or other text than the server's when told ``charset=utf-16`` of a UTF-8
body, and the server ran the request either way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Rig

from loraplex.server.json_route import INLINE_JSON_BYTES

BODY = {"model": "support", "prompt": "The acme support team", "max_tokens": 3}


def _post(rig: Rig, raw: bytes, content_type: str = "application/json") -> Any:
    headers = {**rig.headers("acme"), "Content-Type": content_type}
    return rig.client.post("/v1/completions", content=raw, headers=headers)


def _refused(reply: Any, found: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "Content-Type", error
    assert found in error["message"] and "UTF-8" in error["message"], error


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_body_in_another_unicode_encoding_is_refused(rig: Rig, encoding: str) -> None:
    _refused(_post(rig, json.dumps(BODY).encode(encoding)), "a body in utf-")
    assert rig.engine.requests == []


def test_a_large_body_in_utf16_is_refused_before_it_is_parsed(rig: Rig) -> None:
    body = {**BODY, "prompt": "x" * INLINE_JSON_BYTES}
    _refused(_post(rig, json.dumps(body).encode("utf-16")), "a body in utf-16")


@pytest.mark.parametrize("charset", ["utf-16", "latin-1", "us-ascii"])
def test_a_declared_charset_other_than_utf8_is_refused(rig: Rig, charset: str) -> None:
    reply = _post(rig, json.dumps(BODY).encode(), f"application/json; charset={charset}")
    _refused(reply, f"declared charset '{charset}'")


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", 'application/json;charset="UTF-8"'],
)
def test_utf8_is_served_declared_or_not(rig: Rig, content_type: str) -> None:
    assert _post(rig, json.dumps(BODY).encode(), content_type).status_code == 200


def test_a_utf8_byte_order_mark_is_ignored_as_before(rig: Rig) -> None:
    """RFC 8259 lets a parser ignore it, as Python's does."""
    assert _post(rig, b"\xef\xbb\xbf" + json.dumps(BODY).encode()).status_code == 200
