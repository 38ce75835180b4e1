"""The OpenAI-compatible model list: /v1/models and /v1/models/{model}.

Every route authenticates a tenant key first. A caller sees the base model and exactly the
adapters it may use (its own and public ones); anything else is the registry's one 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from loraplex.artifacts.identity import is_name
from loraplex.registry import Adapter, Revision
from loraplex.registry.sql.paging import (
    DEFAULT_PAGE,
    MAX_CURSOR_CHARS,
    MAX_PAGE,
    Page,
    unknown_cursor,
)
from loraplex.server.auth import DepsDep, TenantDep
from loraplex.server.deps import ServerDeps
from loraplex.server.protocol import ModelCard, ModelList

router = APIRouter(prefix="/v1")
# The unpaged list's cards at most (the base model's among them): what one call reads and sends
# is bounded however many adapters are public; past it ``has_more`` and ``?after=`` page on.
MAX_UNPAGED_CARDS = MAX_PAGE


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
async def list_models(
    tenant: TenantDep,
    deps: DepsDep,
    after: Annotated[str | None, Query(min_length=1, max_length=MAX_CURSOR_CHARS)] = None,
    limit: Annotated[int | None, Query(ge=1, le=MAX_PAGE)] = None,
) -> ModelList:
    """The base model and exactly the adapters the caller may use (its own and public ones),
    the base model first, then by owner and name: at most ``limit`` cards (default 100) after
    the card whose ``id`` is ``after``. Without ``limit`` and ``after``, ``MAX_UNPAGED_CARDS``
    at most (OpenAI's and vLLM's list is not paged, and their clients read one answer), so one
    call's cost is bounded however many adapters are public; ``has_more`` says when the list
    was cut. Read on the pool in one of the tenant's places (``tenant_jobs.py``)."""
    default = MAX_UNPAGED_CARDS if after is None and limit is None else DEFAULT_PAGE
    page = Page(_adapter_cursor(after, tenant.name, deps), limit or default)
    return await deps.jobs.run(tenant.name, _listing, deps, tenant.name, page, after is None)


def _listing(deps: ServerDeps, caller: str, page: Page, with_base: bool) -> ModelList:
    """One page of the list; with ``with_base``, the base model's card is its first."""
    registry = deps.registry
    adapters = registry.usable_adapters(caller, page)
    own = [a.name for a in adapters if a.tenant == caller]
    signed = registry.signed_adapters(caller, own)  # this page's only
    cards = [
        *([_base_card(deps)] if with_base else []),
        *(_card(a, caller, deps, signed=signed.get(a.name)) for a in adapters),
    ]
    if len(cards) > page.limit:  # the base card took a place: the page's last adapter is next
        return ModelList(data=cards[: page.limit], has_more=True)
    full = bool(adapters) and len(adapters) == page.limit
    more = full and bool(registry.usable_adapters(caller, Page(adapters[-1].ref, 1)))
    return ModelList(data=cards, has_more=more)


def _adapter_cursor(after: str | None, caller: str, deps: ServerDeps) -> str | None:
    """The adapter position (``tenant/name``) after the card whose ``id`` is ``after``: the
    base model's is the start; the caller's own adapters are listed by bare name."""
    if after is None or after == deps.config.base_model_name:
        return None
    if "/" in after:
        return after
    if not is_name(after):  # no adapter's name (``%FF`` read as U+FFFD): not a card of this list
        raise unknown_cursor(after, "model of this list")
    return f"{caller}/{after}"


@router.get("/models/{model:path}")
async def get_model(model: str, tenant: TenantDep, deps: DepsDep) -> ModelCard:
    """One model the caller may use; the registry's one 404 for anything else. A pinned
    ``...@revision`` gets that revision's card. Read on the pool in one of the tenant's places
    (``tenant_jobs.py``): one tenant's flood of lookups waits on its own places."""
    if model == deps.config.base_model_name:
        return _base_card(deps)
    return await deps.jobs.run(tenant.name, _lookup, deps, tenant.name, model)


def _lookup(deps: ServerDeps, caller: str, model: str) -> ModelCard:
    """The card of ``model`` (an adapter's alias or pinned revision) for ``caller``."""
    registry = deps.registry
    revision = registry.resolve_revision(caller, model)
    adapter = registry.get_adapter(revision.tenant, revision.name)
    if "@" in model:
        return _card(adapter, caller, deps, revision)
    signed = None
    if adapter.tenant == caller:  # NOTE: this adapter's rows only, not all the tenant's
        signed = registry.signed_adapters(caller, [adapter.name]).get(adapter.name)
    return _card(adapter, caller, deps, signed=signed)
