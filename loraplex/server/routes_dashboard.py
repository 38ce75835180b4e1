"""The live fleet page: ``GET /admin/fleet`` (the data), ``GET /admin/fleet/history`` (the last
hour of it) and ``GET /admin/dashboard`` (the page).

``/admin/fleet`` needs the admin key like every /admin route and returns ``FleetState.to_json()``
of ``deps.fleet``: the fleet's ingress, or for one ``loraplex serve`` its ``LocalFleetState``
(``serve/local_fleet.py``; ``serve/front.py`` always passes one). ``/admin/fleet/history``
(admin key too) returns ``FleetHistory.to_json()``: the samples the server took of that view
plus per-tenant-class and top-revision traffic (``server/history.py``); ``?after=N`` returns
only the samples after sequence number N. An app built without a fleet source (``deps.fleet``
None, e.g. a test of other routes) answers both 503 ``no_fleet``: HTTP does not build the view.

The page and its script, chart library and style (``server/static/``) are public files holding
no data (``auth.DASHBOARD_PATHS``): a browser cannot send a bearer header when it navigates. The
page takes the admin key from the URL fragment (``#key=...``, never sent to a server) or a form,
keeps it in the tab's sessionStorage, loads the history, then polls ``/admin/fleet`` once a
second and the history for new samples. Its
Content-Security-Policy allows scripts and styles from this origin only (nothing inline), so a
replica id or reason shown on it cannot run as code; nothing is fetched from elsewhere.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from loraplex.clock import MonotonicClock
from loraplex.router.fleet_state import FleetStateSource
from loraplex.server.auth import DASHBOARD_ASSETS, DASHBOARD_PATH, require_admin
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import ApiError
from loraplex.server.history import FleetHistory

router = APIRouter()

PAGE_FILE = "dashboard.html"
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def fleet_history(deps: ServerDeps) -> FleetHistory | None:
    """The history of ``deps.fleet`` and this server's traffic (``Server`` starts its sampler);
    None without a fleet source."""
    if deps.fleet is None:
        return None
    return FleetHistory(deps.fleet, deps.metrics.traffic, deps.history, MonotonicClock())


def _no_fleet() -> ApiError:
    return ApiError(503, "this server has no fleet view", "server_error", "no_fleet")


@router.get("/admin/fleet", dependencies=[Depends(require_admin)])
async def fleet(request: Request) -> JSONResponse:
    """Every replica's occupancy, hits and load, and the router's decisions (cumulative)."""
    source: FleetStateSource | None = request.app.state.fleet
    if source is None:
        raise _no_fleet()
    # NOTE: on the thread pool: a fleet's source may wait on its replicas' reports.
    state = await run_in_threadpool(source.fleet_state)
    return JSONResponse(state.to_json(), headers={"Cache-Control": "no-store"})


@router.get("/admin/fleet/history", dependencies=[Depends(require_admin)])
async def fleet_history_route(
    request: Request, after: int = Query(default=0, ge=0, le=1 << 62)
) -> JSONResponse:
    """The samples of the last ``length_s`` (those after sequence number ``after``)."""
    history: FleetHistory | None = request.app.state.history
    if history is None:
        raise _no_fleet()
    body = await run_in_threadpool(history.to_json, after)
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


@functools.cache
def static_file(name: str) -> bytes:
    """A file of ``server/static/`` (read once: they never change while the server runs)."""
    return resources.files("loraplex.server").joinpath("static", name).read_bytes()


def _serve(name: str) -> Response:
    suffix = name[name.rindex(".") :]
    return Response(static_file(name), media_type=_CONTENT_TYPES[suffix], headers=PAGE_HEADERS)


@router.get(DASHBOARD_PATH, include_in_schema=False)
def dashboard_page() -> Response:
    return _serve(PAGE_FILE)


def _asset_route(name: str) -> None:
    def asset() -> Response:
        return _serve(name)

    router.add_api_route(f"{DASHBOARD_PATH}/{name}", asset, methods=["GET"],
                         include_in_schema=False, name=f"dashboard_{name}")  # fmt: skip


for _name in DASHBOARD_ASSETS:
    _asset_route(_name)
