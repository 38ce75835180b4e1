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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from loraplex.server.body_errors import DuplicateKeyError
from loraplex.server.tenant_jobs import caller_of

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


class _StrictJsonRequest(Request):
    """The route's request with a strict ``json()``; the body is read (and kept) by the
    request it wraps, which the error handlers are given."""

    def __init__(self, outer: Request) -> None:
        super().__init__(outer.scope, outer.receive)
        self._outer = outer

    async def body(self) -> bytes:
        return await self._outer.body()

    async def json(self) -> Any:
        if not hasattr(self, "_unique_json"):
            body = await self.body()
            if len(body) <= INLINE_JSON_BYTES:
                self._unique_json = loads_unique(body)
            else:  # in one of its tenant's places on the pool (tenant_jobs.py)
                jobs = self.app.state.deps.jobs
                self._unique_json = await jobs.run(caller_of(self.scope), loads_unique, body)
        return self._unique_json


class StrictJsonRoute(APIRoute):
    """An ``APIRoute`` whose JSON body refuses repeated keys: FastAPI turns the parser's
    ``DuplicateKeyError`` into a 400 caused by it, which ``errors.py`` words."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request))

        return strict
