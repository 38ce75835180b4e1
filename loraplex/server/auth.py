"""Who is calling: tenant API keys (the registry decides) and the separate admin credential.

A tenant key authenticates through ``Registry.authenticate`` (hashed, constant-time, revocation
read from the database on every request), on the thread pool, off the event loop. The admin
credential is a different secret compared in constant time here; a tenant key never passes it,
whatever the tenant. ``server/limits.py`` runs these checks from the headers before any byte of
the body is read and leaves the tenant it found in the scope state, so the dependency below does
not read the database a second time. Which credential a path needs is decided here, from the path
alone (``required_credential``), for the middleware, the listener split and the OpenAPI documents.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from loraplex.errors import AuthenticationError
from loraplex.registry import Tenant
from loraplex.server.admin_query import check_query
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import unauthorized
from loraplex.server.tenant_jobs import AUTHENTICATED_TENANT

ADMIN_ACTOR = "admin-api"  # the audit log's actor for changes made through /admin
# Scope state key: (start, end) wall-clock ns of the tenant check and rate bucket (traces).
AUTHORIZATION_NS = "loraplex_authorization_ns"

TENANT_PREFIX = "/v1"
ADMIN_PREFIX = "/admin"
# vLLM's adapter loading lives under /v1 but is an operator's act: it needs the admin credential
# (vLLM leaves it open to any client that can reach the port; its documentation warns about it).
LOAD_LORA_PATH = "/v1/load_lora_adapter"
UNLOAD_LORA_PATH = "/v1/unload_lora_adapter"
# vLLM serves these tenant routes at the root, outside /v1.
TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
# The admin dashboard's page and its scripts and style: public, since a browser cannot send a
# bearer header when it navigates. They hold no data; the page reads /admin/fleet with the key.
# NOTE: exact paths only: anything else under /admin, ``/admin/dashboard/../x`` included, needs
# the admin key.
DASHBOARD_PATH = "/admin/dashboard"
DASHBOARD_ASSETS = ("dashboard.css", "chart.js", "dashboard.js", "traffic.js")
DASHBOARD_PATHS = frozenset((DASHBOARD_PATH, *(f"{DASHBOARD_PATH}/{n}" for n in DASHBOARD_ASSETS)))


class Credential(StrEnum):
    """The key a route needs."""

    TENANT = "tenant"  # a tenant API key
    ADMIN = "admin"  # the administrative credential


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def required_credential(path: str) -> Credential | None:
    """The key ``path`` needs before its body is read; None: public, or the route checks itself
    (``/metrics``, public when ``metrics_public``; the dashboard's static files)."""
    if path in DASHBOARD_PATHS:
        return None
    if path in (LOAD_LORA_PATH, UNLOAD_LORA_PATH) or _under(path, ADMIN_PREFIX):
        return Credential.ADMIN
    if path in (TOKENIZE_PATH, DETOKENIZE_PATH) or _under(path, TENANT_PREFIX):
        return Credential.TENANT
    return None


async def get_deps(request: Request) -> ServerDeps:
    """The server's dependencies. NOTE: ``async``: FastAPI runs a plain ``def`` dependency on
    the thread pool, a hop per request for a lookup (``tests/server/test_loop_dependencies.py``)."""
    deps: ServerDeps = request.app.state.deps
    return deps


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when absent or malformed."""
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def bearer_token(request: Request) -> str | None:
    return parse_bearer(request.headers.get("authorization"))


# NOTE: a first request made with the admin key (the first key `serve` prints) was told only
# "invalid API key"; only the admin key's holder can get this message, so it tells nothing new.
ADMIN_KEY_ON_TENANT_ROUTE = (
    "invalid API key: this is the admin key, which only the admin routes and /metrics take; "
    "send a tenant's API key (`loraplex keys create TENANT` issues one)"
)
NO_KEY = "invalid API key: none was sent; send the header `Authorization: Bearer <tenant API key>`"


async def authenticate(deps: ServerDeps, token: str | None) -> Tenant:
    """The tenant owning ``token``; 401 otherwise, one message for every unknown, malformed or
    revoked key (a caller learns nothing by probing); a missing key and the admin key are told
    what to send instead."""
    if token is None:
        raise unauthorized(NO_KEY)
    # NOTE: no cache of verified keys, though this pool hop is about a fifth of the loop's time
    # in a flood of 429s (docs/benchmarks/attack22.md): revocation reaches this server only
    # through the database. ``loraplex keys revoke`` (another process) and another replica's
    # /admin write the registry and tell no server, so a cached key would stay valid until its
    # entry expired, where a read per request refuses it at once (operations.md: "immediate").
    # The tenant read here also carries the quotas the bucket checks, which apply at once too
    # (a raised max_requests_per_s). A cache would need a change feed from the registry; until
    # one exists, every tenant request reads it (tests/server/test_auth.py: a key revoked
    # outside the server).
    try:
        return await run_in_threadpool(deps.registry.authenticate, token)
    except AuthenticationError:
        if admin_key_matches(token, deps.admin.current()):
            raise unauthorized(ADMIN_KEY_ON_TENANT_ROUTE) from None
        raise unauthorized() from None


async def require_tenant(
    request: Request, deps: Annotated[ServerDeps, Depends(get_deps)]
) -> Tenant:
    """The tenant the middleware authenticated, else the one owning the bearer key (401); then
    the call's query string and path are checked (``admin_query``)."""
    tenant = request.scope.get("state", {}).get(AUTHENTICATED_TENANT)
    if not isinstance(tenant, Tenant):
        tenant = await authenticate(deps, bearer_token(request))
    check_query(request)
    return tenant


def admin_key_matches(token: str, admin_key: str) -> bool:
    """Constant-time comparison (hashing first so the length of the key does not leak)."""
    presented = hashlib.sha256(token.encode("utf-8")).digest()
    expected = hashlib.sha256(admin_key.encode("utf-8")).digest()
    return hmac.compare_digest(presented, expected)


# NOTE: a call with no key at all was told only "invalid admin credential", as a wrong key is;
# what to send tells a caller nothing about the key (a tenant route says it too: ``NO_KEY``).
ADMIN_NO_KEY = (
    "invalid admin credential: none was sent; send the header `Authorization: Bearer <admin "
    "key>` (one `loraplex serve` generated is kept in `<data dir>/admin-key`)"
)


def check_admin(token: str | None, admin_key: str) -> None:
    """Nothing for the admin credential; 401 for any other, tenant keys included."""
    if token is None:
        raise unauthorized(ADMIN_NO_KEY)
    if not admin_key_matches(token, admin_key):
        raise unauthorized("invalid admin credential")


async def require_admin(request: Request, deps: Annotated[ServerDeps, Depends(get_deps)]) -> str:
    """The audit actor of an admin call (the middleware checked the key too; this is cheap);
    then the call's query string and path are checked (``admin_query``)."""
    check_admin(bearer_token(request), deps.admin.current())
    check_query(request)
    return ADMIN_ACTOR


TenantDep = Annotated[Tenant, Depends(require_tenant)]
DepsDep = Annotated[ServerDeps, Depends(get_deps)]
