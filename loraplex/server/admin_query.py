"""The query string and path of an admin or tenant call: a query parameter the route does not
take, one given twice, or a value holding a NUL character is a 400 naming it
(``auth.require_admin`` and ``auth.require_tenant`` run the check once the credential passed, so
every admin and tenant route has it).

NOTE: FastAPI ignores query parameters a route does not declare and keeps the last of a repeated
one. The paged listings (``/admin/releases``, ``/admin/adapters``, ``/admin/keys``) take
``after``, while ``/admin/residency`` takes ``offset``: a client paging with ``offset=100`` (or a
typo, ``afterr=``) was answered the first page again, every time, and never reached the end;
nothing may be silently ignored (docs/operations.md, *Request fields*). A NUL character cannot
be stored in PostgreSQL's text: a cursor or a tenant name holding one was a driver error there
(a 500) and an empty answer on SQLite. The tenant routes had the same gaps: ``GET /v1/models``
pages by ``limit`` / ``after`` too (a tenant's NUL cursor was PostgreSQL's 500, ``offset=`` or a
typo was the first page again), and a query parameter on ``/v1/completions`` (``?stream=true``)
was dropped in silence.
"""

from __future__ import annotations

import weakref

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.requests import Request

from loraplex.errors import clipped, quoted
from loraplex.server.errors import invalid_request

# id(route) -> (the route, weakly; the query parameters it takes). APIRoute is unhashable, so the
# key is its id, and the weak reference tells a later route given a freed one's id (apps are
# built and dropped, tests build many) from the route the entry was made for.
_TAKEN: dict[int, tuple[weakref.ref[APIRoute], frozenset[str]]] = {}


def check_query(request: Request) -> None:
    """Raises the 400 of the first query parameter ``request``'s route does not take (or that
    comes twice), or of the first query or path value holding a NUL character."""
    taken = _taken(request.scope.get("route"))
    seen: set[str] = set()
    for name, value in request.query_params.multi_items():
        shown = clipped(name)
        if taken is not None and name not in taken:
            expected = ", ".join(sorted(taken)) or "none"
            raise invalid_request(
                f"query parameter {quoted(name)} is not taken here; expected: {expected}", shown
            )
        if name in seen:
            raise invalid_request(f"query parameter {quoted(name)} is given twice", shown)
        seen.add(name)
        _no_nul(name, value)
    for name, value in request.path_params.items():
        if isinstance(value, str):
            _no_nul(name, value)


def _no_nul(name: str, value: str) -> None:
    if "\x00" in value:
        raise invalid_request(f"{clipped(name)} holds a NUL character; no name or id does", name)


def _taken(route: object) -> frozenset[str] | None:
    """The query parameters ``route`` reads (its dependencies' too); None: not a FastAPI route."""
    if not isinstance(route, APIRoute):
        return None
    cached = _TAKEN.get(id(route))
    if cached is not None and cached[0]() is route:
        return cached[1]
    taken = frozenset(_query_names(route.dependant))
    _TAKEN[id(route)] = (weakref.ref(route), taken)
    return taken


def _query_names(dependant: Dependant) -> set[str]:
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
