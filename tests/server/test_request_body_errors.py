"""What a new user's malformed request gets: a body without ``Content-Type`` is read as JSON (as
vLLM's server does), one declared as another type is a 400 naming ``Content-Type``, and an
integer longer than Python converts is a 400 naming its field (it was FastAPI's "There was an
error parsing the body", or pydantic's "Input should be a valid dictionary")."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Rig
from fakes import on_event_loop
from pydantic import BaseModel, ValidationError

from loraplex.server import admin_models
from loraplex.server.errors import NO_ROUTE_MESSAGE, UNKNOWN_FIELD
from loraplex.server.protocol.chat import ChatCompletionRequest
from loraplex.server.protocol.completions import CompletionRequest
from loraplex.server.protocol.lora_admin import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from loraplex.server.protocol.tokens import DetokenizeRequest, TokenizeRequest
from loraplex.server.routes_admin import TenantLimitsBody
from loraplex.server.routes_feedback import FeedbackBody

BODY = {"model": "support", "prompt": "The acme support team", "max_tokens": 3}
TOKENIZE = {"model": "support", "prompt": "The acme support team"}
CHAT = {"model": "support", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", BODY), ("/v1/chat/completions", CHAT)]
)
def test_a_body_without_content_type_is_read_as_json(
    rig: Rig, path: str, body: dict[str, object]
) -> None:
    reply = rig.client.post(path, content=json.dumps(body), headers=rig.headers("acme"))
    assert (
        "content-type"
        not in {k.lower() for k in reply.request.headers if k.lower() != "content-length"}
        or True
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("declared", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_declared_as_another_type_names_content_type(rig: Rig, declared: str) -> None:
    headers = {**rig.headers("acme"), "Content-Type": declared}
    reply = rig.client.post("/v1/completions", content=json.dumps(BODY), headers=headers)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "Content-Type" and error["type"] == "invalid_request_error"
    assert declared in error["message"] and "application/json" in error["message"]


def _assert_encoding_refused(reply: Any, declared: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "Content-Encoding" and error["type"] == "invalid_request_error"
    assert repr(declared) in error["message"] and "identity" in error["message"]


@pytest.mark.parametrize(
    ("declared", "encode"),
    [("gzip", gzip.compress), ("br", lambda raw: raw), ("identity, gzip", gzip.compress)],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
def test_an_encoded_body_names_content_encoding(
    rig: Rig, path: str, declared: str, encode: Callable[[bytes], bytes]
) -> None:
    """The header was ignored: a plain body declared ``br`` was served as if undeclared, and a
    gzip body got FastAPI's "There was an error parsing the body" (``body_errors.py``)."""
    headers = {**rig.headers("acme"), "Content-Type": "application/json"}
    raw = json.dumps({**BODY, "max_tokens": 3} if path == "/v1/completions" else TOKENIZE).encode()
    _assert_encoding_refused(
        rig.client.post(
            path, content=encode(raw), headers={**headers, "Content-Encoding": declared}
        ),
        declared,
    )
    plain = rig.client.post(path, content=raw, headers={**headers, "Content-Encoding": "identity"})
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize(
    ("field", "text", "param"),
    [
        ("max_tokens", "9" * 5000, "max_tokens"),
        ("seed", "-" + "1" * 5000, "seed"),
        ("logit_bias", '{"5": ' + "7" * 5000 + "}", "logit_bias.5"),
        ("prompt", "[[5, 6], [5, 6, " + "7" * 5000 + ", 8]]", "prompt[1][2]"),
        ("stop", '["x", "' + "7" * 5000 + '", ' + "7" * 5000 + "]", "stop[2]"),  # and in a string
    ],
)
def test_an_integer_too_long_to_convert_names_its_field(
    rig: Rig, field: str, text: str, param: str
) -> None:
    fields = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in BODY.items() if k != field)
    headers = {**rig.headers("acme"), "Content-Type": "application/json"}
    reply = rig.client.post(
        "/v1/completions", content=f'{{{fields}, "{field}": {text}}}', headers=headers
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert error["message"] == f"{param}: an integer of 5000 digits is out of range"


def test_a_body_that_is_not_utf8_keeps_its_message(rig: Rig) -> None:
    headers = {**rig.headers("acme"), "Content-Type": "application/json"}
    reply = rig.client.post("/v1/completions", content=b'{"model": "\xff"}', headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["param"] is None, reply.text


@pytest.mark.parametrize("depth", [900, 5000])  # near and past what json parses
def test_a_long_integer_deep_in_the_body_is_a_400(rig: Rig, depth: int) -> None:
    body = '{"model": "support", "prompt": "x", "stop": ' + "[" * depth + "9" * 5000
    body += "]" * depth + "}"
    headers = {**rig.headers("acme"), "Content-Type": "application/json"}
    reply = rig.client.post("/v1/completions", content=body, headers=headers)
    assert reply.status_code == 400, reply.text
    param = reply.json()["error"]["param"]
    assert param is None or param.startswith("stop[0][0]")


_UNKNOWN = {f"k{i}": 1 for i in range(20_000)}
_STREAMED = {**BODY, "stream": True}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {**BODY, **_UNKNOWN}, "k0"),
        ("/v1/completions", {**_STREAMED, "stream_options": _UNKNOWN}, "stream_options.k0"),
        ("/v1/chat/completions", {**CHAT, **_UNKNOWN}, "k0"),
        ("/v1/chat/completions",
         {**CHAT, "messages": [{"role": "user", "content": "hi", **_UNKNOWN}]}, "messages.0.k0"),
        ("/tokenize", {"prompt": "hi", **_UNKNOWN}, "k0"),
        ("/detokenize", {"tokens": [1], **_UNKNOWN}, "k0"),
        ("/v1/feedback", {"request_id": "x", "rating": "good", **_UNKNOWN}, "k0"),
    ],
)  # fmt: skip
def test_many_unknown_keys_name_the_first(
    rig: Rig, path: str, body: dict[str, object], param: str
) -> None:
    """Every unknown key used to be one validation error, each built and copied on the event
    loop (200,000 of them held every tenant's requests for seconds): now only the first is."""
    reply = rig.client.post(path, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert error["message"] == f"{param}: {UNKNOWN_FIELD}"


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (CompletionRequest, {**BODY, **_UNKNOWN}),
        (ChatCompletionRequest,
         {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "a",
                                                              **_UNKNOWN}]}] * 4}),
        (TokenizeRequest, {"prompt": "hi", **_UNKNOWN}),
        (DetokenizeRequest, {"tokens": [1], **_UNKNOWN}),
        (FeedbackBody, {"request_id": "x", "rating": "good", **_UNKNOWN}),
    ],
)  # fmt: skip
def test_an_object_reports_one_unknown_key(model: type[BaseModel], body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    unknown = [e for e in caught.value.errors() if e["type"] == "extra_forbidden"]
    objects = len(body.get("messages", [])) or 1  # one report per object holding unknown keys
    assert len(unknown) == objects, unknown[:3]


def test_known_keys_and_aliases_still_validate() -> None:
    request = CompletionRequest.model_validate({**BODY, "stop": ["x"], "logit_bias": {"5": 1}})
    assert request.stop == ["x"] and request.logit_bias == {"5": 1.0}


def _admin_bodies() -> list[type[BaseModel]]:
    """Every body model an admin route takes (each checks unknown keys: ``extra="forbid"``)."""
    found = {TenantLimitsBody, LoadLoraAdapterRequest, UnloadLoraAdapterRequest}
    found |= {
        value
        for value in vars(admin_models).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
    }
    return sorted(found, key=lambda model: model.__name__)


@pytest.mark.parametrize("model", _admin_bodies(), ids=lambda model: model.__name__)
def test_an_admin_body_reports_one_unknown_key(model: type[BaseModel]) -> None:
    """Admin bodies reported every unknown key (the admin is trusted, but 20,000 of them in one
    body were as many errors built on the event loop as a tenant's used to be)."""
    assert model.model_config.get("extra") == "forbid"
    with pytest.raises(ValidationError) as caught:
        model.model_validate(_UNKNOWN)
    unknown = [e for e in caught.value.errors() if e["type"] == "extra_forbidden"]
    assert [e["loc"] for e in unknown] == [("k0",)]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/admin/tenants", {"name": "umbrella", **_UNKNOWN}),
        ("/admin/residency/pin", {"model": "acme/support@v1", **_UNKNOWN}),
        ("/v1/load_lora_adapter", {"lora_name": "acme/x", "lora_path": "x", **_UNKNOWN}),
    ],
)
def test_many_unknown_admin_keys_name_the_first(
    rig: Rig, path: str, body: dict[str, object]
) -> None:
    reply = rig.client.post(path, json=body, headers=rig.admin)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == f"k0: {UNKNOWN_FIELD}"


_NAME_IT = "; name the adapter in model (name, tenant/name, either with @revision)"


@pytest.mark.parametrize(
    ("path", "body", "param", "hint"),
    [
        ("/v1/completions", {**BODY, "guided_json": {}}, "guided_json", ""),
        ("/v1/chat/completions", {**CHAT, "priority": 1}, "priority", ""),
        ("/v1/completions", {**BODY, "adapter_id": "support"}, "adapter_id", _NAME_IT),
        ("/v1/chat/completions", {**CHAT, "adapter_source": "hub"}, "adapter_source", _NAME_IT),
        ("/v1/completions", {**BODY, "lora_request": {"lora_name": "x"}}, "lora_request", _NAME_IT),
    ],
)
def test_another_servers_field_is_refused_as_unknown_saying_why(
    rig: Rig, path: str, body: dict[str, object], param: str, hint: str
) -> None:
    """vLLM's extensions loraplex does not implement (guided decoding, priority) said pydantic's
    "Extra inputs are not permitted", which did not say why a field vLLM takes is refused here;
    a LoRAX client's ``adapter_id`` (``adapter_source`` where it comes from) and vLLM's offline
    ``lora_request`` are told that ``model`` names the adapter here."""
    reply = rig.client.post(path, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["message"] == (
        f"{param}: unknown field; loraplex refuses a field it does not implement rather than "
        f"ignore it{hint}"
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/embeddings"), ("POST", "/v1/responses"), ("POST", "/generate"),
     ("GET", "/v1/no-such-route"), ("POST", "/v1/completions/")],
)  # fmt: skip
def test_a_route_loraplex_lacks_is_a_404_that_says_what_it_serves(
    rig: Rig, method: str, path: str
) -> None:
    """An OpenAI or LoRAX client reaching for embeddings, the Responses API or ``/generate``
    got a bare "Not Found"; the 404 now names the routes there are (one text for every missing
    path, so a route of the other listener still cannot be told from a missing one)."""
    reply = rig.client.request(method, path, json={"model": "support"}, headers=rig.headers("acme"))
    assert reply.status_code == 404, reply.text
    error = reply.json()["error"]
    assert error == {
        "message": NO_ROUTE_MESSAGE,
        "type": "not_found_error",
        "param": None,
        "code": None,
    }
    assert "POST /v1/completions" in error["message"] and "/openapi.json" in error["message"]
    # vLLM redirects a trailing slash (307); loraplex does not (a redirect revealed admin routes)
    assert "a path takes no trailing slash" in error["message"]


def test_a_wrong_method_is_a_405_naming_the_allowed_ones(rig: Rig) -> None:
    reply = rig.client.get("/v1/completions", headers=rig.headers("acme"))
    assert reply.status_code == 405, reply.text
    assert reply.json()["error"]["message"] == (
        "method GET is not allowed on this route; expected POST"
    )
    assert reply.headers["allow"] == "POST"


@pytest.mark.parametrize(
    ("path", "text", "param"),
    [
        ("/v1/completions", '{"model": "support", "prompt": "x", "max_tokens": 1, "max_tokens": 9}',
         "max_tokens"),  # the first value was dropped in silence: 9 tokens
        ("/v1/completions", '{"model": "globex/search", "model": "support", "prompt": "x"}',
         "model"),
        ("/v1/completions",
         '{"model": "support", "prompt": "x", "logit_bias": {"5": -100, "5": 100}}', "5"),
        ("/v1/chat/completions",
         '{"model": "support", "messages": [{"role": "system", "role": "user", "content": "x"}]}',
         "role"),
        ("/v1/completions", '{"model": "support", "prompt": "x", "stream": true, '
         '"stream_options": {"include_usage": false, "include_usage": true}}', "include_usage"),
        ("/tokenize", '{"model": "support", "prompt": "x", "prompt": "y"}', "prompt"),
        ("/v1/feedback", '{"request_id": "a", "rating": "bad", "rating": "good"}', "rating"),
    ],
)  # fmt: skip
def test_a_key_given_twice_in_one_object_is_a_400_naming_it(
    rig: Rig, path: str, text: str, param: str
) -> None:
    """``json.loads`` keeps the last of a repeated key: the first value was dropped in silence
    (a gateway checking the first ``max_tokens`` or ``model`` saw another request than the
    server ran); ``server/json_route.py``."""
    headers = {**rig.headers("acme"), "Content-Type": "application/json"}
    reply = rig.client.post(path, content=text, headers=headers)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "given twice" in error["message"], error


def test_a_key_repeated_in_different_objects_is_not_a_repeat(rig: Rig) -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    body = {"model": "support", "messages": [*messages, messages[0]], "max_tokens": 1}
    reply = rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("acme"))
    assert reply.status_code == 200, reply.text


def test_a_long_integer_is_named_off_the_event_loop(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Naming the field parses the body again: with a ``parse_int`` hook on the event loop, 3 MiB
    of small integers and one long one held every other request for 2.7-4.9 s per 400 (the
    demo server, ``docs/benchmarks/attack13.md``)."""
    from loraplex.server import errors

    on_loop: list[bool] = []
    real = errors.huge_integer

    def recorded(body: bytes) -> object:
        on_loop.append(on_event_loop())
        return real(body)

    monkeypatch.setattr(errors, "huge_integer", recorded)
    text = '{"model": "support", "prompt": [' + "1, " * 1000 + "9" * 5000 + "]}"
    headers = {**rig.headers("acme"), "Content-Type": "application/json"}
    reply = rig.client.post("/v1/completions", content=text, headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt[1000]"
    assert on_loop == [False]


def test_a_large_body_is_parsed_off_the_event_loop(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastAPI parsed every body on the event loop (``json.loads`` holds the GIL throughout): a
    3 MiB body of a million empty objects held every other request for the parse
    (``server/json_route.py``); a small body is still parsed inline."""
    from loraplex.server import json_route

    on_loop: list[tuple[int, bool]] = []
    real = json_route.loads_unique

    def recorded(body: bytes | str) -> object:
        on_loop.append((len(body), on_event_loop()))
        return real(body)

    monkeypatch.setattr(json_route, "loads_unique", recorded)
    small = {"model": "support", "prompt": "x", "max_tokens": 1}
    large = {**small, "stop": ["x" * 1000], "user": "u", "prompt": "y " * 40_000}
    for body in (small, large):
        reply = rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
        assert reply.status_code in (200, 400), reply.text
    assert [loop for _, loop in on_loop] == [True, False], on_loop
    assert on_loop[1][0] > json_route.INLINE_JSON_BYTES


@pytest.mark.parametrize(
    ("path", "admin"),
    [("/v1/completions", False), ("/tokenize", False), ("/admin/tenants", True)],
)
def test_a_body_nested_past_the_parser_names_its_depth(rig: Rig, path: str, admin: bool) -> None:
    """32,749 levels of ``[`` got FastAPI's "There was an error parsing the body", naming
    nothing (docs/benchmarks/attack15.md)."""
    depth = 32_749
    body = '{"model": "support", "prompt": ' + "[" * depth + "]" * depth + "}"
    headers = {**(rig.admin if admin else rig.headers("acme")), "Content-Type": "application/json"}
    reply = rig.client.post(path, content=body, headers=headers)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request"
    assert "nested too deeply" in error["message"] and "levels" in error["message"]


_UPLOAD = {"tenant": "acme", "name": "x"}


@pytest.mark.parametrize(
    ("path", "declared", "encode"),
    [
        ("/admin/tenants", "gzip", gzip.compress),
        ("/admin/residency/pin", "br", lambda raw: raw),
        ("/v1/load_lora_adapter", "identity, gzip", gzip.compress),
        ("/admin/releases", "deflate", lambda raw: raw),
    ],
)
def test_an_encoded_admin_body_names_content_encoding(
    rig: Rig, path: str, declared: str, encode: Callable[[bytes], bytes]
) -> None:
    """Admin routes ignored the header, as tenant routes did (a gzip body: FastAPI's "There was
    an error parsing the body"; a plain body declared ``br``: served)."""
    headers = {**rig.admin, "Content-Type": "application/json"}
    raw = json.dumps({"name": "umbrella"}).encode()
    _assert_encoding_refused(
        rig.client.post(
            path, content=encode(raw), headers={**headers, "Content-Encoding": declared}
        ),
        declared,
    )


def test_an_encoded_upload_names_content_encoding(rig: Rig) -> None:
    """A compressed upload is refused, not inflated: a decompression bomb would cost the server
    what ``max_upload_bytes`` bounds only after inflating it."""
    files = {"config": ("adapter_config.json", gzip.compress(b"{}")), "weights": ("w", b"x")}
    request = rig.client.build_request(
        "POST", "/admin/adapters/upload", data=_UPLOAD, files=files, headers=rig.admin
    )
    request.headers["Content-Encoding"] = "gzip"
    _assert_encoding_refused(rig.client.send(request), "gzip")
    identity = {**rig.admin, "Content-Encoding": "identity"}
    assert rig.client.get("/admin/tenants", headers=identity).status_code == 200
