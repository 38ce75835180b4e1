"""Tenant routes read their JSON bodies strictly: a key given twice in one object is a 400
naming it (``StrictJsonRoute``).

NOTE: ``json.loads`` keeps the last of a repeated key, so ``{"max_tokens": 1, "max_tokens":
4096}`` or ``{"model": "support", "model": "search"}`` passed with the first value dropped in
silence (nothing may be: docs/operations.md, *Request fields*); a proxy or gateway that checks
the first value (a ``max_tokens`` cap, an allowed ``model``) was told one request while the
server ran another. Python's parser reads every key and builds the object either way; the pairs
hook only compares the count of keys with the object's size.

A body larger than ``INLINE_JSON_BYTES`` is parsed on the thread pool. NOTE: FastAPI parsed every
body on the event loop, and ``json.loads`` holds the GIL for the whole parse: a tenant's body
of a million empty objects (3 MiB, within ``max_body_bytes``) held every other request for the
parse, 0.25-0.44 s on the 2 shared cores, before its 400. The pairs hook is Python code run once
per object, so the parse, 2-3x slower with it, also lets the event loop take the GIL between
objects (docs/benchmarks/attack13.md). So do the number hooks (``_int``, ``_float``), called per
number. NOTE: a body with no object inside but one flat array (``prompt`` 3 MiB of ``1.0``, or
one ``logit_bias`` object of 150,000 keys, whose hook runs once, at its end) was parsed in C
from end to end, holding the GIL 0.2-0.5 s on the shared 2 cores, and two connections of one
tenant sending it raised another tenant's median 4.7x-6.0x before their 400s
(docs/benchmarks/attack22.md); with the hooks the parse takes about twice as long on its thread
and the loop runs between numbers. A flat array of strings, ``null`` or booleans calls no hook:
0.1 s for 3 MiB of ``""`` items is what is left.

Such a body is validated against the route's body model there too, in the same place, and the
route is handed the model it built (FastAPI's own check of a model instance takes no time). NOTE:
FastAPI validated every body on the event loop: 16 token-id prompts of 65,536 ids (2 MiB, refused
later by the context length) took 0.4 s there, a conversation of 1,024 messages of 16 text parts
0.2 s, and 8 connections of one tenant sending them held another tenant's 1-token completion
0.7 and 2.2 s at the median (``scripts/attacks/attack14/body-crowd``). On the thread the Python
validators let the loop take the GIL between items, and the tenant's places bound how many such
bodies are validated at once.

So is a smaller body with more than ``INLINE_JSON_ITEMS`` commas and opening brackets: a body's
cost is its values, not its bytes. NOTE: a body of at most 64 KiB was parsed and validated on the
event loop whatever it held: 147 messages of 16 empty text parts (2,352 parts, 65,300 bytes)
took 8.8 ms there (in-process, one at a time), and 8 connections of one tenant sending it held
another tenant's 1-token completion 361 ms at the median (docs/benchmarks/attack14.md,
docs/benchmarks/attack15.md). Counting the separators (one pass in C, 0.13 ms for 64 KiB on the
loaded 2 cores, none for a body shorter than the cap) bounds the loop's share: at most 512 items,
0.32 ms for the costliest kind (empty messages); an honest chat of a few dozen messages, or a
``logit_bias`` of a hundred entries, stays inline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from loraplex.server.body_errors import (
    DuplicateKeyError,
    EncodedBody,
    InvalidBody,
    not_utf8,
    unsupported_content_encoding,
)
from loraplex.server.errors import invalid_request
from loraplex.server.prompt_bounds import BODY_CHECKS, BodyCheck
from loraplex.server.tenant_jobs import caller_of

if TYPE_CHECKING:
    from fastapi._compat import ModelField

    from loraplex.server.deps import ServerConfig

INLINE_JSON_BYTES = 64 << 10  # larger bodies are parsed on the thread pool (module docstring)
# Commas and opening brackets in a body parsed on the event loop, at most (module docstring).
INLINE_JSON_ITEMS = 512


def json_items(body: bytes) -> int:
    """The values in the JSON ``body``, within one: each value after the first of a list or an
    object follows a comma, each list or object opens with a bracket (counted inside strings
    too, so never fewer), counted in one pass in C without parsing it."""
    return len(body) - len(body.translate(None, b",{["))


def parsed_inline(body: bytes) -> bool:
    """Whether ``body`` is parsed and validated on the event loop (module docstring)."""
    if len(body) <= INLINE_JSON_ITEMS:  # fewer bytes than the cap: no count needed
        return True
    return len(body) <= INLINE_JSON_BYTES and json_items(body) <= INLINE_JSON_ITEMS


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return found


def _int(text: str) -> int:
    """``int(text)`` as Python code, which the parser calls per integer (module docstring)."""
    return int(text)


def _float(text: str) -> float:
    """``float(text)`` as Python code, which the parser calls per number with a fraction or an
    exponent (module docstring)."""
    return float(text)


def loads_unique(body: bytes | str) -> Any:
    """``json.loads`` that refuses a key repeated within one object (``DuplicateKeyError``),
    running Python code per object and per number (module docstring)."""
    return json.loads(body, object_pairs_hook=_unique, parse_int=_int, parse_float=_float)


@dataclass(frozen=True)
class BodyModel:
    """What a route's large body is checked against where it is parsed."""

    field: ModelField  # the route's one body model
    checks: tuple[BodyCheck, ...]  # its dependencies' checks by length, run first (prompt_bounds)


def parse_and_validate(body: bytes, model: BodyModel | None, config: ServerConfig) -> Any:
    """``body`` parsed strictly and, with the route's ``model``, checked by its lengths and then
    validated into its model (``InvalidBody`` when it does not match)."""
    data = loads_unique(body)
    if model is None:
        return data
    for check in model.checks:  # len() alone: before the schema walks a single item
        check(data, config)
    value, errors = model.field.validate(data, {}, loc=("body",))
    if errors:
        raise InvalidBody(RequestValidationError(errors, body=None))
    return value


class _StrictJsonRequest(Request):
    """The route's request with a strict ``json()``; the body is read (and kept) by the
    request it wraps, which the error handlers are given. ``model``: what a large body is
    checked against where it is parsed (module docstring)."""

    def __init__(self, outer: Request, model: BodyModel | None) -> None:
        super().__init__(outer.scope, outer.receive)
        self._outer = outer
        self._model = model

    async def body(self) -> bytes:
        return await self._outer.body()

    async def json(self) -> Any:
        if not hasattr(self, "_unique_json"):
            if problem := unsupported_content_encoding(self.headers.get("content-encoding")):
                raise EncodedBody(problem)
            body = await self.body()
            if problem := not_utf8(self.headers.get("content-type"), body):
                raise EncodedBody(problem)
            if parsed_inline(body):
                self._unique_json = loads_unique(body)
            elif (tenant := caller_of(self.scope)) is not None:
                # its large body's place, then one of its places on the pool (tenant_jobs.py)
                deps = self.app.state.deps
                async with deps.large_bodies.place(tenant), deps.jobs.place(tenant):
                    self._unique_json = await run_in_threadpool(
                        parse_and_validate, body, self._model, deps.config
                    )
            else:  # no tenant's key passed: parsed only, as FastAPI would
                self._unique_json = await run_in_threadpool(loads_unique, body)
        return self._unique_json


class IdentityBodyRoute(APIRoute):
    """An ``APIRoute`` that refuses a request declaring its body encoded (``Content-Encoding``
    other than ``identity``) before the body is read: the admin routes and the upload.

    NOTE: they ignored the header (tenant routes refuse it in ``_StrictJsonRequest.json``): a
    gzip body got FastAPI's "There was an error parsing the body", a plain body declared ``br``
    was served. A compressed upload is refused, not inflated: ``max_upload_bytes`` bounds the
    bytes received, and a decompression bomb is small until inflated."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def identity_only(request: Request) -> Response:
            if problem := unsupported_content_encoding(request.headers.get("content-encoding")):
                raise invalid_request(problem.message, problem.param)
            return await handler(request)

        return identity_only


class StrictJsonRoute(APIRoute):
    """An ``APIRoute`` whose JSON body refuses repeated keys: FastAPI turns the parser's
    ``DuplicateKeyError`` into a 400 caused by it, which ``errors.py`` words. A large body is
    checked and validated where it is parsed, off the event loop (module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = self._body_model()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request, model))

        return strict

    def _body_model(self) -> BodyModel | None:
        """The route's one body model (FastAPI validates any other body itself) and the length
        checks of its dependencies."""
        if self.body_field is None or self._embed_body_fields:
            return None
        calls = [dependency.call for dependency in self.dependant.dependencies]
        checks = tuple(BODY_CHECKS[call] for call in calls if call in BODY_CHECKS)
        return BodyModel(self.body_field, checks)
