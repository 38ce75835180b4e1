"""Who is calling: tenant API keys (the registry decides) and the separate admin credential.

A tenant key authenticates through ``Registry.authenticate`` (hashed, constant-time, revocation
read from the database on every request). The admin credential is a different secret compared in
constant time here; a tenant key never passes it, whatever the tenant. Both dependencies are
plain functions, so FastAPI runs the registry's database read on its thread pool, off the event
loop.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request

from loraplex.errors import AuthenticationError
from loraplex.registry import Tenant
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import unauthorized

ADMIN_ACTOR = "admin-api"  # the audit log's actor for changes made through /admin


def get_deps(request: Request) -> ServerDeps:
    deps: ServerDeps = request.app.state.deps
    return deps


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when absent or malformed."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def require_tenant(request: Request, deps: Annotated[ServerDeps, Depends(get_deps)]) -> Tenant:
    """The tenant owning the bearer key; 401 (one message for every failure) otherwise."""
    token = bearer_token(request)
    if token is None:
        raise unauthorized()
    try:
        return deps.registry.authenticate(token)
    except AuthenticationError:
        raise unauthorized() from None


def admin_key_matches(token: str, admin_key: str) -> bool:
    """Constant-time comparison (hashing first so the length of the key does not leak)."""
    presented = hashlib.sha256(token.encode("utf-8")).digest()
    expected = hashlib.sha256(admin_key.encode("utf-8")).digest()
    return hmac.compare_digest(presented, expected)


def require_admin(request: Request, deps: Annotated[ServerDeps, Depends(get_deps)]) -> str:
    """The audit actor of an admin call; 401 for any other credential, tenant keys included."""
    token = bearer_token(request)
    if token is None or not admin_key_matches(token, deps.config.admin_key):
        raise unauthorized("invalid admin credential")
    return ADMIN_ACTOR


TenantDep = Annotated[Tenant, Depends(require_tenant)]
AdminDep = Annotated[str, Depends(require_admin)]
DepsDep = Annotated[ServerDeps, Depends(get_deps)]
