"""The FastAPI application: ``create_app(ServerDeps)`` wires routes, errors and metrics.

Routes: the OpenAI-compatible API under /v1 and vLLM's /tokenize and /detokenize (tenant keys),
the admin API under /admin and vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (the
admin credential), /metrics (Prometheus text; the admin credential unless ``metrics_public``),
/version and /openapi.json (public; the admin document at /admin/openapi.json, see
``openapi_docs.py``), the live fleet page /admin/dashboard and its data /admin/fleet (see
``routes_dashboard.py``), and the two probes (Kubernetes' split, the paths vLLM's server uses):

- /health is liveness: 200 whenever this HTTP server answers, also while the engine process
  starts or restarts (restarting the server would not help; the body says the engine is down);
- /ready is readiness: 200 only once the engine takes requests and the registry database is
  reachable, else 503 with the reason (send no traffic here yet); the registry is pinged at
  most once a second, its answer shared by concurrent callers (``readiness.py``).

The engine runs on its own thread or process; handlers only await it.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from loraplex.errors import EngineUnavailableError
from loraplex.server import (
    openapi_docs,
    readiness,
    routes_admin,
    routes_dashboard,
    routes_feedback,
    routes_models,
    routes_openai,
    routes_release,
    routes_residency,
    routes_tokenize,
    routes_vllm_admin,
)
from loraplex.server.auth import bearer_token, check_admin, require_admin
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import DEFAULT_RETRY_AFTER_S, ApiError, install_error_handlers
from loraplex.server.limits import RequestLimits
from loraplex.server.metrics import CONTENT_TYPE
from loraplex.server.metrics_status import CountStatuses
from loraplex.server.readiness import RegistryPing


def create_app(deps: ServerDeps) -> FastAPI:
    # NOTE: FastAPI's own /openapi.json would describe the admin routes to everyone.
    app = FastAPI(
        title="loraplex",
        version=routes_tokenize.loraplex_version(),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # NOTE: a redirect of ``/metrics/`` to ``/metrics`` would tell a tenant on the public
        # socket that an admin route exists there (the guard's 404 hides it otherwise).
        redirect_slashes=False,
        # A body without Content-Type is read as JSON, as FastAPI did before its strict default
        # (and so vLLM's server on such versions). NOTE: that default guards cookie sessions
        # against cross-site posts; every credential here is an Authorization header, which a
        # browser never adds to a cross-site request without a CORS preflight.
        strict_content_type=False,
    )
    app.state.deps = deps
    app.state.registry_ping = RegistryPing(deps.registry.ping, readiness.PING_INTERVAL_S)
    app.state.openapi_documents = {}  # built on first request (``openapi_docs.document``)
    install_error_handlers(app)
    app.add_middleware(RequestLimits, deps=deps)  # credentials and body limits before parsing
    # outside RequestLimits, so its 429s are counted; the counts are read when a response starts
    app.add_middleware(CountStatuses, counts=lambda: deps.metrics.statuses)
    app.include_router(routes_openai.router)
    app.include_router(routes_models.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_residency.router)
    app.include_router(routes_tokenize.router)
    app.include_router(routes_vllm_admin.router)
    app.include_router(routes_feedback.router)
    app.include_router(routes_release.router)
    app.include_router(routes_dashboard.router)
    app.state.fleet = deps.fleet  # what /admin/fleet reads (None: 503 no_fleet)
    app.state.history = routes_dashboard.fleet_history(deps)  # sampled by Server; None: no fleet
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ready", ready, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route(openapi_docs.PUBLIC_PATH, public_openapi, methods=["GET"],
                      include_in_schema=False)  # fmt: skip
    app.add_api_route(openapi_docs.ADMIN_PATH, admin_openapi, methods=["GET"],
                      include_in_schema=False, dependencies=[Depends(require_admin)])  # fmt: skip
    return app


_ENGINE_DOWN_HEADERS = {"Retry-After": str(int(DEFAULT_RETRY_AFTER_S))}


async def health(request: Request) -> JSONResponse:
    """Liveness: cheap (no I/O) and 200 while this server answers; says when the engine is still
    starting (``"status": "starting"``: it cannot serve yet) or down."""
    deps: ServerDeps = request.app.state.deps
    state = deps.engine.health()
    if state.up:
        return JSONResponse({"status": "ok"})
    reason, restarts = state.down_reason, state.num_restarts
    if state.starting:
        return JSONResponse({"status": "starting", "engine": "starting", "reason": reason})
    engine = "hung" if state.hung else "down"
    return JSONResponse({"status": "ok", "engine": engine, "reason": reason, "restarts": restarts})


async def ready(request: Request) -> JSONResponse:
    """Readiness: 503 until the engine takes requests and the registry answers."""
    deps: ServerDeps = request.app.state.deps
    state = deps.engine.health()
    if not state.up:  # starting, or until the restarted engine answers
        body = {
            "status": "not_ready",
            "reason": EngineUnavailableError.__name__,
            "detail": state.down_reason,
        }
        return JSONResponse(body, status_code=503, headers=_ENGINE_DOWN_HEADERS)
    try:
        deps.engine.load_snapshot()
    except Exception as exc:  # any failure means "not ready"; the reason is for operators
        return JSONResponse({"status": "not_ready", "reason": type(exc).__name__}, status_code=503)
    registry_ping: RegistryPing = request.app.state.registry_ping
    failure = await registry_ping.failure()  # at most one ping a second, shared
    if failure is not None:
        return JSONResponse({"status": "not_ready", "reason": failure}, status_code=503)
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    deps: ServerDeps = request.app.state.deps
    if not deps.config.metrics_public:
        try:
            check_admin(bearer_token(request), deps.admin.current())
        except ApiError as refused:
            return refused.response()
    body = await run_in_threadpool(deps.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE)


async def public_openapi(request: Request) -> JSONResponse:
    """The tenant API's OpenAPI document (public, as vLLM's)."""
    return JSONResponse(openapi_docs.document(request.app, admin=False))


async def admin_openapi(request: Request) -> JSONResponse:
    """Every route's OpenAPI document, admin routes included."""
    return JSONResponse(openapi_docs.document(request.app, admin=True))
