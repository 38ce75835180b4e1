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
objects (docs/benchmarks/attack13.md).

Such a body is validated against the route's body model there too, in the same place, and the
route is handed the model it built (FastAPI's own check of a model instance takes no time). NOTE:
FastAPI validated every body on the event loop: 16 token-id prompts of 65,536 ids (2 MiB, refused
later by the context length) took 0.4 s there, a conversation of 1,024 messages of 16 text parts
0.2 s, and 8 connections of one tenant sending them held another tenant's 1-token completion
0.7 and 2.2 s at the median (``scripts/attacks/attack14/body-crowd``). On the thread the Python
validators let the loop take the GIL between items, and the tenant's places bound how many such
bodies are validated at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from loraplex.registry import Tenant
from loraplex.server.auth import AUTHENTICATED_TENANT
from loraplex.server.body_errors import DuplicateKeyError, InvalidBody

if TYPE_CHECKING:
    from fastapi._compat import ModelField

INLINE_JSON_BYTES = 64 << 10  # larger bodies are parsed on the thread pool (module docstring)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return found


def loads_unique(body: bytes | str) -> Any:
    """``json.loads`` that refuses a key repeated within one object (``DuplicateKeyError``)."""
    return json.loads(body, object_pairs_hook=_unique)


def parse_and_validate(body: bytes, field: ModelField | None) -> Any:
    """``body`` parsed strictly and, with the route's body ``field``, validated into its model
    (``InvalidBody`` when it does not match)."""
    data = loads_unique(body)
    if field is None:
        return data
    value, errors = field.validate(data, {}, loc=("body",))
    if errors:
        raise InvalidBody(RequestValidationError(errors, body=None))
    return value


class _StrictJsonRequest(Request):
    """The route's request with a strict ``json()``; the body is read (and kept) by the
    request it wraps, which the error handlers are given. ``field``: the route's one body
    model, which a large body is validated against where it is parsed (module docstring)."""

    def __init__(self, outer: Request, field: ModelField | None) -> None:
        super().__init__(outer.scope, outer.receive)
        self._outer = outer
        self._field = field

    async def body(self) -> bytes:
        return await self._outer.body()

    async def json(self) -> Any:
        if not hasattr(self, "_unique_json"):
            body = await self.body()
            tenant = self.scope.get("state", {}).get(AUTHENTICATED_TENANT)
            if len(body) <= INLINE_JSON_BYTES:
                self._unique_json = loads_unique(body)
            elif isinstance(tenant, Tenant):  # its large body's place, then one on the pool
                deps = self.app.state.deps
                async with deps.large_bodies.place(tenant.name), deps.jobs.place(tenant.name):
                    self._unique_json = await run_in_threadpool(
                        parse_and_validate, body, self._field
                    )
            else:
                self._unique_json = await run_in_threadpool(parse_and_validate, body, self._field)
        return self._unique_json


class StrictJsonRoute(APIRoute):
    """An ``APIRoute`` whose JSON body refuses repeated keys: FastAPI turns the parser's
    ``DuplicateKeyError`` into a 400 caused by it, which ``errors.py`` words. A large body is
    validated where it is parsed, off the event loop (module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        # one body model, given as the whole body (FastAPI validates the body itself otherwise)
        field = None if self._embed_body_fields else self.body_field

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request, field))

        return strict
