"""What keeps one caller on one revision: the ``user`` field, else ``X-Session-Id``. An empty
``user`` names no end user (the header decides); a malformed header is a 400 naming it whether
or not ``user`` wins, and before the request's fan-out is charged; ``user`` is at most 256
characters (a 400 naming it)."""

from __future__ import annotations

import pytest
from conftest import BASE_NAME, Rig
from starlette.requests import Request

from loraplex.server.errors import ApiError
from loraplex.server.serving import sticky_key


def _request(session: str | None) -> Request:
    headers = [] if session is None else [(b"x-session-id", session.encode("latin-1"))]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


def test_the_user_field_wins_and_an_empty_one_names_no_user() -> None:
    assert sticky_key(_request("s-1"), "ana") == "user:ana"
    assert sticky_key(_request("s-1"), "") == "session:s-1"
    assert sticky_key(_request(None), "") is None
    assert sticky_key(_request(None), None) is None


# "café": printable Latin-1, not ASCII (it passed: the check was isprintable() alone, the doc
# said printable ASCII); a no-break space (not printable) was refused already
@pytest.mark.parametrize("session", ["", "x" * 257, "a\tb", "caf\u00e9", "a\u00a0b"])
def test_a_malformed_session_header_is_refused_even_when_user_wins(session: str) -> None:
    for user in (None, "", "ana"):
        with pytest.raises(ApiError) as refused:
            sticky_key(_request(session), user)
        assert refused.value.status == 400 and refused.value.param == "X-Session-Id"


def test_printable_ascii_up_to_the_bound_passes() -> None:
    printable = "".join(chr(c) for c in range(0x20, 0x7F))
    assert sticky_key(_request(printable), None) == f"session:{printable}"
    assert sticky_key(_request("x" * 256), None) == "session:" + "x" * 256


def test_over_http_an_empty_user_passes_and_a_long_one_is_refused(rig: Rig) -> None:
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2, "user": ""}
    headers = rig.headers("acme")
    assert rig.client.post("/v1/completions", json=body, headers=headers).status_code == 200
    long = rig.client.post("/v1/completions", json={**body, "user": "u" * 257}, headers=headers)
    assert long.status_code == 400 and long.json()["error"]["param"] == "user"
