"""The FastAPI application: ``create_app(ServerDeps)`` wires routes, errors and metrics.

Routes: the OpenAI-compatible API under /v1 (tenant keys), the admin API under /admin (the admin
credential), /metrics (Prometheus text; the admin credential unless ``metrics_public``), /health
(the process is up) and /ready (the engine answers and the registry database is reachable).
The engine runs on its own thread or process; handlers only await it.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from loraplex.server import routes_admin, routes_openai
from loraplex.server.auth import admin_key_matches, bearer_token
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import install_error_handlers, unauthorized
from loraplex.server.metrics import CONTENT_TYPE, ServerMetrics


def create_app(deps: ServerDeps) -> FastAPI:
    app = FastAPI(title="loraplex", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.deps = deps
    app.state.metrics = ServerMetrics(deps.engine, deps.cache)
    install_error_handlers(app)
    app.include_router(routes_openai.router)
    app.include_router(routes_admin.router)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ready", ready, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    return app


async def health() -> dict[str, str]:
    return {"status": "ok"}


def _registry_reachable(deps: ServerDeps) -> None:
    with deps.registry.db.transaction(write=False) as tx:
        tx.query_one("SELECT 1")


async def ready(request: Request) -> JSONResponse:
    deps: ServerDeps = request.app.state.deps
    try:
        deps.engine.load_snapshot()
        await run_in_threadpool(_registry_reachable, deps)
    except Exception as exc:  # any failure means "not ready"; the reason is for operators
        body = {"status": "not_ready", "reason": type(exc).__name__}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    deps: ServerDeps = request.app.state.deps
    if not deps.config.metrics_public:
        token = bearer_token(request)
        if token is None or not admin_key_matches(token, deps.config.admin_key):
            return unauthorized("invalid admin credential").response()
    server_metrics: ServerMetrics = request.app.state.metrics
    body = await run_in_threadpool(server_metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE)
