"""The admin API under /admin: registry administration (tenants, keys, adapters, aliases,
releases, audit); the adapter cache's routes are ``routes_residency``'s.

Every route requires the admin credential (``auth.require_admin``); a tenant key gets the same 401
as any other wrong credential. Registration takes either a directory inside the configured
import directory or an upload; nothing here fetches a URL. Registry calls are blocking database
and file work, so routes are plain functions that FastAPI runs on its thread pool.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import Field, ValidationError
from starlette.concurrency import run_in_threadpool

from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.signature import SignatureProblem
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.errors import SignatureError
from loraplex.registry import (
    AliasTarget,
    PriorityClass,
    RegistrationRequest,
    RegistrationResult,
    RevisionState,
)
from loraplex.registry.imports import staged_import
from loraplex.registry.sql.audit import MAX_AUDIT_PAGE
from loraplex.registry.sql.audit import MAX_SEQ as MAX_AUDIT_SEQ
from loraplex.server.admin_models import (
    AliasBody,
    PageDep,
    QuotasBody,
    RegisterBody,
    ReleaseBody,
    TenantBody,
    UploadFields,
    VisibilityBody,
    check_gpu_cap,
)
from loraplex.server.auth import ADMIN_ACTOR, DepsDep, require_admin
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import ApiError, invalid_request
from loraplex.server.json_route import IdentityBodyRoute
from loraplex.server.merge_guard import guarded, left_by
from loraplex.server.protocol.fields import FirstUnknownKeyBody
from loraplex.server.upload import receive_upload, staging_hidden

router = APIRouter(
    prefix="/admin", dependencies=[Depends(require_admin)], route_class=IdentityBodyRoute
)
ACTOR = ADMIN_ACTOR  # the audit log's actor for every change made here


# --- tenants and keys ----------------------------------------------------------------------------


@router.get("/tenants")
def list_tenants(deps: DepsDep, page: PageDep) -> list[Any]:
    """By name; the next page is ``after`` = the last ``name``."""
    return [asdict(t) for t in deps.registry.list_tenants(page)]


class TenantLimitsBody(FirstUnknownKeyBody):
    """Changes to a tenant's priority class and quotas: a field absent from the body keeps its
    stored value (a quota set to null becomes unlimited)."""

    priority: PriorityClass | None = None
    quotas: QuotasBody = Field(default_factory=QuotasBody)


@router.post("/tenants", status_code=201)
def create_tenant(body: TenantBody, deps: DepsDep) -> Any:
    check_gpu_cap(body.quotas.max_gpu_bytes, deps.config.gpu_slot_bytes)
    tenant = deps.registry.create_tenant(body.name, ACTOR, body.priority, body.quotas.quotas())
    deps.refresh_tenants()  # the engine side enforces the new tenant's settings at once
    return asdict(tenant)


@router.put("/tenants/{tenant}")
def set_tenant_limits(tenant: str, body: TenantLimitsBody, deps: DepsDep) -> Any:
    changes = body.quotas.model_dump(exclude_unset=True)
    check_gpu_cap(changes.get("max_gpu_bytes"), deps.config.gpu_slot_bytes)
    updated = deps.registry.set_tenant_limits(tenant, ACTOR, body.priority, changes)
    deps.refresh_tenants()
    return asdict(updated)


@router.post("/tenants/{tenant}/keys", status_code=201)
def create_key(tenant: str, deps: DepsDep) -> Any:
    """A new API key; its token is in this response only."""
    return asdict(deps.registry.create_key(tenant, ACTOR))


@router.get("/keys")
def list_keys(deps: DepsDep, page: PageDep, tenant: str | None = None) -> list[Any]:
    """By tenant, then age; the next page is ``after`` = the last ``key_id``."""
    return [asdict(k) for k in deps.registry.list_keys(tenant, page)]


@router.delete("/keys/{key_id}")
def revoke_key(key_id: str, deps: DepsDep) -> Any:
    return asdict(deps.registry.revoke_key(key_id, ACTOR))


# --- adapters and releases -------------------------------------------------------------------


@router.get("/adapters")
def list_adapters(deps: DepsDep, page: PageDep, tenant: str | None = None) -> list[Any]:
    """By tenant, then name; the next page is ``after`` = the last ``tenant/name``."""
    return [asdict(a) for a in deps.registry.list_adapters(tenant, page)]


@router.get("/adapters/{tenant}/{name}")
def show_adapter(tenant: str, name: str, deps: DepsDep, page: PageDep) -> Any:
    """The adapter, its alias and one page of its revisions, oldest first; the next page is
    ``after`` = the last ``revision``."""
    adapter = deps.registry.get_adapter(tenant, name)
    alias = deps.registry.get_alias(tenant, name)
    return {
        "adapter": asdict(adapter),
        "alias": None if alias is None else asdict(alias),
        "revisions": [asdict(r) for r in deps.registry.list_revisions(tenant, name, page)],
    }


def _register(deps: ServerDeps, request: RegistrationRequest) -> JSONResponse:
    return _registered(deps, deps.registry.register(request, ACTOR))


def _registered(deps: ServerDeps, result: RegistrationResult) -> JSONResponse:
    """The registration's answer; a new revision's warm policy also reaches this server's cache
    now, as ``PUT /admin/revisions/...`` does. NOTE: it was only recorded, applied at the next
    start: an upload with ``warm_policy=gpu`` answered 201 ``"warm_policy": "gpu"`` and the
    copy stayed unpinned and unloaded while the server ran."""
    revision = result.revision
    warm = revision.warm_policy
    if result.created and warm is not WarmPolicy.ON_DEMAND and deps.cache is not None:
        deps.cache.set_warm_policy(revision.key(), warm)
    payload = {
        "created": result.created,
        "revision": asdict(revision),
        "warnings": list(result.warnings),  # accepted, but said (``ValidatedAdapter.warnings``)
    }
    return JSONResponse(plain(payload), status_code=201 if result.created else 200)


def no_import_dir(action: str, param: str) -> ApiError:
    """The 400 for a registration by server path on a server without ``import_dir``: it says
    which setting turns it on, since the operator is the one who reads it."""
    return invalid_request(
        f"{action} by server path is disabled: this server has no import directory; start "
        "`loraplex serve` with --import-dir DIR (config key import_dir; a fleet reads it in "
        "the [serve] table of `fleet up --config`), or upload the files "
        "(POST /admin/adapters/upload)",
        param,
    )


def register_import(
    deps: ServerDeps, path: str, fields: dict[str, Any], revision_of: Callable[[Path], str]
) -> RegistrationResult:
    """Registers the PEFT folder ``path`` inside the import directory, read without following
    links from a private copy (``registry/imports.py``); ``revision_of`` labels the revision from
    that copy (vLLM's load route names it by content when the caller does not)."""
    if deps.config.import_dir is None:
        raise no_import_dir("registration", "path")
    with (
        staged_import(deps.config.import_dir, path) as adapter_dir,
        staging_hidden(adapter_dir, path),
    ):
        revision = revision_of(adapter_dir)
        request = RegistrationRequest(adapter_dir=adapter_dir, revision=revision, **fields)
        return deps.registry.register(request, ACTOR)


@router.post("/adapters", response_model=None)
def register_from_import_dir(body: RegisterBody, deps: DepsDep) -> JSONResponse:
    """Register a PEFT directory already on the server, inside the import directory."""
    fields = body.model_dump(exclude={"path", "revision"})
    return _registered(deps, register_import(deps, body.path, fields, lambda _: body.revision))


@router.post("/adapters/upload", response_model=None)
async def register_upload(request: Request, deps: DepsDep) -> JSONResponse:
    """Register an uploaded adapter (multipart parts ``config`` and ``weights``, optionally
    ``signature`` (a model-signing bundle), plus the text fields of ``UploadFields``),
    validated exactly like a directory on disk. The parts stream straight into a private staging
    directory (``server/upload.py``)."""
    staging = Path(tempfile.mkdtemp(prefix="loraplex-upload-"))
    try:
        with staging_hidden(staging, "upload"):
            return await _register_staged_upload(request, deps, staging)
    finally:
        await run_in_threadpool(shutil.rmtree, staging, True)


async def _register_staged_upload(
    request: Request, deps: ServerDeps, staging: Path
) -> JSONResponse:
    texts = await receive_upload(request, staging, deps.config.max_upload_bytes)
    try:
        fields = UploadFields.model_validate(texts)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    registration = RegistrationRequest(adapter_dir=staging, **fields.model_dump())
    return await run_in_threadpool(_register_uploaded, deps, registration)


def _register_uploaded(deps: ServerDeps, registration: RegistrationRequest) -> JSONResponse:
    """``_register``; a signature over more files than an upload carries (PEFT's README.md) is
    told what to sign. NOTE: it read "signed file(s) README.md missing from the folder", and
    the caller had sent no folder."""
    try:
        return _register(deps, registration)
    except SignatureError as exc:
        if exc.reason != SignatureProblem.MISSING_FILE:
            raise
        raise SignatureError(
            exc.reason,
            f"{exc}; an upload carries only {CONFIG_FILE} and {WEIGHTS_FILE} (and the "
            "signature): sign a folder that holds only those two",
        ) from exc


@router.put("/adapters/{tenant}/{name}/alias")
def set_alias(tenant: str, name: str, body: AliasBody, deps: DepsDep) -> Any:
    targets = tuple(AliasTarget(t.revision, t.weight) for t in body.targets)
    with _guard_leaving(deps, tenant, name, targets):
        return asdict(deps.registry.set_alias(tenant, name, targets, ACTOR))


@router.post("/adapters/{tenant}/{name}/rollback")
def rollback_alias(tenant: str, name: str, deps: DepsDep) -> Any:
    alias = deps.registry.get_alias(tenant, name)
    if alias is None or not alias.rollback_targets:  # nothing to roll back to: the registry says
        return asdict(deps.registry.rollback_alias(tenant, name, ACTOR))
    with _guard_leaving(deps, tenant, name, alias.rollback_targets):
        return asdict(deps.registry.rollback_alias(tenant, name, ACTOR))


def _guard_leaving(
    deps: ServerDeps, tenant: str, name: str, targets: tuple[AliasTarget, ...]
) -> AbstractContextManager[None]:
    """409 when the alias would move off a merged revision; else the change runs with the
    revisions it leaves held against merging (docs/modes.md)."""
    alias = deps.registry.get_alias(tenant, name)
    current = () if alias is None else (t.revision for t in alias.targets)
    left = left_by(tenant, name, current, (t.revision for t in targets))
    return guarded(deps.engine, deps.merge_holds, left, f"left by alias {tenant}/{name}")


@router.put("/adapters/{tenant}/{name}/visibility")
def set_visibility(tenant: str, name: str, body: VisibilityBody, deps: DepsDep) -> Any:
    return asdict(deps.registry.set_visibility(tenant, name, body.visibility, ACTOR))


@router.put("/revisions/{tenant}/{name}/{revision}")
def set_release(tenant: str, name: str, revision: str, body: ReleaseBody, deps: DepsDep) -> Any:
    """Release state and/or warm policy; a new warm policy also applies to this server's cache,
    and a deprecation drops the revision's automatic warm policy there (``drop_auto_warm``).
    NOTE: an automatic seat earned by the alias's traffic held the deprecated revision's copy
    pinned, out of its tenant's share, until its rates decayed (hours at a day's traffic) or an
    operator set ``on_demand`` (docs/benchmarks/newop2.md)."""
    ref = f"{tenant}/{name}@{revision}"
    deprecating = body.state is RevisionState.DEPRECATED
    with guarded(deps.engine, deps.merge_holds, (ref,) if deprecating else (), "deprecated"):
        before = deps.registry.get_revision(ref).state if deprecating else None
        updated = deps.registry.set_release(ref, ACTOR, body.state, body.warm_policy)
    if deps.cache is not None:
        if body.warm_policy is not None:
            deps.cache.set_warm_policy(updated.key(), body.warm_policy)
        if deprecating and before is not RevisionState.DEPRECATED:
            deps.cache.drop_auto_warm(updated.key())
    return asdict(updated)


@router.get("/audit")
def audit_log(
    deps: DepsDep,
    after_seq: Annotated[int, Query(ge=0, le=MAX_AUDIT_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 100,
) -> list[Any]:
    """At most ``limit`` entries after ``after_seq``, oldest first: a page of the log, the next
    one from the last ``seq``. NOTE: unbounded, a ``limit`` of -1 read the whole log (SQLite's
    LIMIT -1), and an ``after_seq`` past SQLite's integers was a 500."""
    return [asdict(e) for e in deps.registry.audit_log(after_seq, limit)]


def plain(value: Any) -> Any:
    """JSON-ready: tiers (keys or values) become their names, paths strings."""
    if isinstance(value, IntEnum):
        return value.name
    if isinstance(value, dict):
        return {_key_name(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _key_name(key: object) -> str:
    return key.name if isinstance(key, IntEnum) else str(key)
