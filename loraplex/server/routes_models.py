"""The OpenAI-compatible model list: /v1/models and /v1/models/{model}.

Every route authenticates a tenant key first. A caller sees the base model and exactly the
adapters it may use (its own and public ones); anything else is the registry's one 404.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from loraplex.registry import Adapter, Revision
from loraplex.server.auth import DepsDep, TenantDep
from loraplex.server.deps import ServerDeps
from loraplex.server.protocol import ModelCard, ModelList

router = APIRouter(prefix="/v1")


def _card(
    adapter: Adapter,
    caller: str,
    deps: ServerDeps,
    pinned: Revision | None = None,
    signed: bool | None = None,
) -> ModelCard:
    """``pinned``: the card of one exact revision (``name@revision``), named in ``id`` and
    ``root`` so that a pin is never reported as the alias. ``signed`` is shown to the owner
    only (another tenant learns nothing about a public adapter's provenance)."""
    suffix = "" if pinned is None else f"@{pinned.revision}"
    created = adapter.created_at if pinned is None else pinned.created_at
    if pinned is not None:
        signed = pinned.provenance is not None
    return ModelCard(
        signed=signed if adapter.tenant == caller else None,
        id=(adapter.name if adapter.tenant == caller else adapter.ref) + suffix,
        created=int(created),
        owned_by=adapter.tenant,
        root=adapter.ref + suffix,
        parent=deps.config.base_model_name,
        max_model_len=deps.config.max_model_len,
    )


def _base_card(deps: ServerDeps) -> ModelCard:
    name = deps.config.base_model_name
    return ModelCard(
        id=name,
        created=deps.started_at_s,
        owned_by="loraplex",
        root=name,
        parent=None,
        max_model_len=deps.config.max_model_len,
    )


@router.get("/models")
def list_models(tenant: TenantDep, deps: DepsDep) -> ModelList:
    """The base model and exactly the adapters the caller may use (its own and public ones)."""
    adapters = deps.registry.usable_adapters(tenant.name)
    signed = deps.registry.signed_adapters(tenant.name)
    cards = [
        _base_card(deps),
        *(_card(a, tenant.name, deps, signed=signed.get(a.name)) for a in adapters),
    ]
    return ModelList(data=cards)


@router.get("/models/{model:path}")
async def get_model(model: str, tenant: TenantDep, deps: DepsDep) -> ModelCard:
    """One model the caller may use; the registry's one 404 for anything else. A pinned
    ``...@revision`` gets that revision's card."""
    if model == deps.config.base_model_name:
        return _base_card(deps)
    revision = await run_in_threadpool(deps.registry.resolve_revision, tenant.name, model)
    adapter = await run_in_threadpool(deps.registry.get_adapter, revision.tenant, revision.name)
    if "@" in model:
        return _card(adapter, tenant.name, deps, revision)
    signed = None
    if adapter.tenant == tenant.name:
        owned = await run_in_threadpool(deps.registry.signed_adapters, tenant.name)
        signed = owned.get(adapter.name)
    return _card(adapter, tenant.name, deps, signed=signed)
