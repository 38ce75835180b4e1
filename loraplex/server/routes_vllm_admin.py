"""vLLM's runtime adapter routes, POST /v1/load_lora_adapter and /v1/unload_lora_adapter, so that
operator scripts written for vLLM keep working, without the hole vLLM documents (any client
that reaches its port may load a file path): here both need the admin credential, answer only on
the admin listener when there is one (``listeners.is_admin_path``), and read folders only inside
the import directory, through the same code as ``POST /admin/adapters``.

How vLLM's calls map onto loraplex:

- ``lora_name`` is ``tenant/name`` or ``tenant/name@revision``. Without a revision, the load
  labels it by content: ``sha256-`` and the first 16 hex digits of the weights' digest, so
  loading the same bytes again is idempotent and different bytes never collide.
- load = registration (validated like any other) + a prefetch into CPU memory (L1), awaited.
  Requests name it by the ``model`` the answer returns (the owning tenant's key). NOTE: as any
  registration, only an adapter's first revision becomes what ``tenant/name`` resolves to; a
  later one reaches the name through an alias change (the release flow), not through a load.
- unload = the revision(s) are evicted from every cached tier (L0, L1, L2); without a revision,
  one page of the adapter's revisions (oldest first, ``?limit=&after=`` as the admin listings
  page, ``limit`` 1-1000, default 100), and ``next_after`` names the last one when the page was
  full (call again with ``after`` set to it; null: the last page). NOTE: every revision in one
  call grew the answer and the work (three cache calls each) without bound: revisions are
  never deleted. Unlike vLLM, the revision stays registered (the registry is append-only) and
  its artifact stays in the store: the next request for it loads it again. A copy that is
  pinned, in use or loading is kept: a 409 naming, per tier, what holds it (who pins it, how
  many leases or loads use it, a load under way), as a kept ``/admin/residency/evict`` does.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from loraplex.artifacts.identity import AdapterKey, check_name
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.errors import (
    AdapterNotFoundError,
    CapacityError,
    PathOutsideStoreError,
    RecordNotFoundError,
)
from loraplex.registry import RegistrationResult, Revision
from loraplex.registry.sql.paging import DEFAULT_PAGE, MAX_CURSOR_CHARS, MAX_PAGE, Page
from loraplex.residency.ledger import CACHED_TIERS, Tier
from loraplex.server.auth import LOAD_LORA_PATH, UNLOAD_LORA_PATH, DepsDep, require_admin
from loraplex.server.cache_control import CacheControl
from loraplex.server.copy_holds import holds_text
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import ApiError, ErrorContext, invalid_request, to_api_error
from loraplex.server.json_route import IdentityBodyRoute
from loraplex.server.protocol import (
    LoadLoraAdapterRequest,
    LoraAdapterLoaded,
    LoraAdapterUnloaded,
    UnloadLoraAdapterRequest,
)
from loraplex.server.routes_admin import no_import_dir, register_import

router = APIRouter(dependencies=[Depends(require_admin)], route_class=IdentityBodyRoute)
LOAD_TIER = Tier.L1  # vLLM's load reads the weights into memory; the GPU slot is taken on use
CONTENT_LABEL_PREFIX = "sha256-"
CONTENT_LABEL_DIGITS = 16
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class LoraName:
    """vLLM's ``lora_name`` read as a loraplex adapter reference."""

    tenant: str  # owning tenant (must exist)
    name: str  # adapter name
    revision: str | None  # None: load labels it by content; unload takes every revision

    @classmethod
    def parse(cls, value: str) -> LoraName:
        ref, at, revision = value.partition("@")
        tenant, slash, name = ref.partition("/")
        try:
            if not slash:
                raise ValueError(f"{value!r} names no tenant")
            check_name("tenant", tenant)
            check_name("name", name)
            if at:
                check_name("revision", revision)
        except ValueError as exc:
            raise invalid_request(
                f"lora_name is invalid ({exc}); expected tenant/name or tenant/name@revision",
                "lora_name",
            ) from None
        return cls(tenant, name, revision if at else None)


def content_label(adapter_dir: Path) -> str:
    """The revision label of an unlabelled load: a prefix of the weights' sha256."""
    digest = hashlib.sha256()
    with (adapter_dir / WEIGHTS_FILE).open("rb") as weights:
        while chunk := weights.read(_CHUNK_BYTES):
            digest.update(chunk)
    return CONTENT_LABEL_PREFIX + digest.hexdigest()[:CONTENT_LABEL_DIGITS]


def _cache(deps: ServerDeps) -> CacheControl:
    if deps.cache is None:
        raise ApiError(503, "this server has no adapter cache", "server_error", "no_cache")
    return deps.cache


def _import_path(deps: ServerDeps, lora_path: str) -> str:
    """``lora_path`` relative to the import directory. vLLM scripts send absolute paths: one
    lexically inside the import directory is taken relative to it; anything else is passed on
    unchanged for ``staged_import`` to refuse (absolute, ``..``, links)."""
    if deps.config.import_dir is None:
        raise no_import_dir("loading", "lora_path")
    path = PurePosixPath(lora_path)
    root = PurePosixPath(deps.config.import_dir.absolute())
    if path.is_absolute() and path.is_relative_to(root):
        return str(path.relative_to(root))
    return lora_path


def _register(deps: ServerDeps, lora: LoraName, lora_path: str) -> RegistrationResult:
    fields = {"tenant": lora.tenant, "name": lora.name}
    label = content_label if lora.revision is None else (lambda _: str(lora.revision))
    try:
        result = register_import(deps, _import_path(deps, lora_path), fields, label)
    except PathOutsideStoreError as exc:
        raise invalid_request(str(exc), "lora_path") from None
    return result


@router.post(LOAD_LORA_PATH)
async def load_lora_adapter(body: LoadLoraAdapterRequest, deps: DepsDep) -> LoraAdapterLoaded:
    """Registers the folder (validated like every registration) and loads it into CPU memory."""
    lora = LoraName.parse(body.lora_name)
    cache = _cache(deps)
    try:
        result = await run_in_threadpool(_register, deps, lora, body.lora_path)
    except Exception as exc:  # NOTE: under /v1, so the default mapping would treat it as a tenant's
        raise to_api_error(exc, ErrorContext.ADMIN) from None
    revision, created = result.revision, result.created
    try:
        status, outcome = await _prefetch(cache, revision)
    except Exception as exc:  # NOTE: the registration stays (append-only): the caller is told
        error = to_api_error(exc, ErrorContext.ADMIN)
        kept = f"; {revision.ref} is registered all the same (created: {str(created).lower()})"
        raise replace(error, message=error.message + kept) from None
    return LoraAdapterLoaded(
        lora_name=body.lora_name,
        model=revision.ref,
        created=created,
        tier=LOAD_TIER.name,
        status=status,
        message=f"LoRA adapter {body.lora_name!r} is {revision.ref}: {outcome}",
        warnings=list(result.warnings),
    )


async def _prefetch(
    cache: CacheControl, revision: Revision
) -> tuple[Literal["resident", "deferred"], str]:
    """The load into CPU memory, awaited. NOTE: a capacity error raised by the call itself (an
    engine process that is starting refuses it at once) is deferred as one of the load's: it was
    a 503 after the revision was registered, and a retry answered ``created: false``."""
    try:
        loading = await run_in_threadpool(cache.prefetch, revision.key(), LOAD_TIER)
        await asyncio.wrap_future(loading)
    except CapacityError as exc:  # registered; it loads when first requested
        return "deferred", f"registered; not loaded now ({exc})"
    return "resident", "loaded into CPU memory"


def _revisions(deps: ServerDeps, lora: LoraName, page: Page) -> list[Revision]:
    try:
        if lora.revision is None:
            return deps.registry.list_revisions(lora.tenant, lora.name, page)
        return [deps.registry.get_revision(f"{lora.tenant}/{lora.name}@{lora.revision}")]
    except (AdapterNotFoundError, RecordNotFoundError) as exc:
        raise ApiError(404, str(exc), "invalid_request_error", "not_found", "lora_name") from None


def _evict(cache: CacheControl, key: AdapterKey) -> tuple[list[str], list[str]]:
    """Tiers ``key`` was dropped from, and the tiers still holding it, each with its holds
    (``L1 (pinned by release; in use (2 leases or loads))``); fastest first, so a copy in a slot
    is gone before its host copy is tried. NOTE: the 409 named the tiers only, and the operator
    had to guess which of a pin (whose), a lease or a load kept each copy."""
    evicted: list[str] = []
    kept: list[str] = []
    for tier in CACHED_TIERS:
        if cache.evict(key, tier):
            evicted.append(tier.name)
            continue
        holds = cache.holds(key, tier)
        if holds.resident:
            kept.append(f"{tier.name} ({holds_text(holds) or 'nothing holds it now: retry'})")
    return evicted, kept


def _page(lora: LoraName, after: str | None, limit: int | None) -> Page:
    """The page of revisions an unload without a revision takes; with one, paging is a 400."""
    if lora.revision is not None:
        for name, value in (("after", after), ("limit", limit)):
            if value is not None:
                raise invalid_request(
                    f"{name} is invalid with a lora_name naming a revision; expected it only "
                    "with tenant/name (it pages the adapter's revisions)",
                    name,
                )
    return Page(after, DEFAULT_PAGE if limit is None else limit)


# A pin has owners (server/pin_owners.py) and a warm policy pins too, re-pinned by the next
# rebalance: "unpin them" alone left an operator unpinning a copy that stayed pinned.
WHO_PINS = (
    "a pin is lifted by the one who made it: an operator's by POST /admin/residency/unpin, a "
    "warm policy's (the operator's or the automatic one of a busy revision) by PUT "
    '/admin/revisions/TENANT/NAME/REVISION {"warm_policy": "on_demand"}, a release\'s hold '
    "when its window ends"
)


def _unload(
    deps: ServerDeps, cache: CacheControl, lora: LoraName, page: Page
) -> tuple[dict[str, list[str]], str | None]:
    """Tiers dropped per revision, and the cursor of the next page (None: none follows)."""
    evicted: dict[str, list[str]] = {}
    kept: dict[str, list[str]] = {}
    revisions = _revisions(deps, lora, page)
    for revision in revisions:
        evicted[revision.ref], held = _evict(cache, revision.key())
        if held:
            kept[revision.ref] = held
    if kept:
        where = "; ".join(f"{ref} in {', '.join(tiers)}" for ref, tiers in sorted(kept.items()))
        message = (
            f"copies are pinned, in use or loading and were kept: {where} (other copies were "
            f"evicted); {WHO_PINS}, or retry when their requests finished"
        )
        raise ApiError(409, message, "invalid_request_error", "adapter_in_use", "lora_name")
    full = lora.revision is None and len(revisions) == page.limit
    return evicted, revisions[-1].revision if full else None


@router.post(UNLOAD_LORA_PATH)
async def unload_lora_adapter(
    body: UnloadLoraAdapterRequest,
    deps: DepsDep,
    after: Annotated[str | None, Query(min_length=1, max_length=MAX_CURSOR_CHARS)] = None,
    limit: Annotated[int | None, Query(ge=1, le=MAX_PAGE)] = None,
) -> LoraAdapterUnloaded:
    """Evicts the revision(s) from every cached tier; they stay registered (module docstring).
    Without a revision, one page of them: ``after`` / ``limit`` as the admin listings'."""
    lora = LoraName.parse(body.lora_name)
    page = _page(lora, after, limit)
    cache = _cache(deps)
    try:
        evicted, next_after = await run_in_threadpool(_unload, deps, cache, lora, page)
    except Exception as exc:  # NOTE: as in load_lora_adapter
        raise to_api_error(exc, ErrorContext.ADMIN) from None
    num_copies = sum(len(tiers) for tiers in evicted.values())
    message = f"LoRA adapter {body.lora_name!r}: {num_copies} cached copies evicted"
    if next_after is not None:
        message += (
            f" from a page of {len(evicted)} of its revisions; more may follow: call again "
            f"with ?after={next_after}"
        )
    return LoraAdapterUnloaded(
        lora_name=body.lora_name, evicted=evicted, next_after=next_after, message=message
    )
