"""Every route's dependencies run on the event loop: FastAPI runs a plain ``def`` dependency on
the thread pool, a hop per request (and the GIL handed to a worker and back) for what is a
lookup. NOTE: ``auth.get_deps`` was such a ``def``: it took one of the three pool hops of each
request, 7% of the event loop's samples under 16 connections of cancelled streams
(docs/benchmarks/attack15.md, *Cancelled streams*)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIRouter

import loraplex.server


def _calls(dependant: Dependant) -> Iterator[object]:
    for dependency in dependant.dependencies:
        if dependency.call is not None:
            yield dependency.call
        yield from _calls(dependency)


def _routes() -> Iterator[APIRoute]:
    """Every route module's routes (``routes_*.py``), with their routers' dependencies."""
    for module in pkgutil.iter_modules(loraplex.server.__path__):
        if module.name.startswith("routes_"):
            router = importlib.import_module(f"loraplex.server.{module.name}").router
            assert isinstance(router, APIRouter)
            yield from (route for route in router.routes if isinstance(route, APIRoute))


def test_no_route_has_a_dependency_fastapi_runs_on_the_thread_pool() -> None:
    routes = list(_routes())
    assert len(routes) > 20
    on_pool = {
        f"{route.path}: {getattr(call, '__qualname__', call)}"
        for route in routes
        for call in _calls(route.dependant)
        if not inspect.iscoroutinefunction(call)
    }
    assert not on_pool
