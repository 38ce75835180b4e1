"""The admin API's residency routes under /admin/residency: what the adapter cache holds (a page
of copies, its counters, the most requested adapters) and the operator's pin, unpin, prefetch
and evict of one revision in one tier.

Every route requires the admin credential (``auth.require_admin``), as ``routes_admin``'s. The
cache's calls may wait on an engine process or on every replica of a fleet, so each runs on the
thread pool while the handler awaits.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.cache import CopyHolds
from loraplex.server.admin_models import ResidencyBody
from loraplex.server.auth import DepsDep, require_admin
from loraplex.server.cache_control import CacheControl
from loraplex.server.copy_holds import held_by, holds_text
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import ApiError, invalid_request
from loraplex.server.json_route import IdentityBodyRoute
from loraplex.server.routes_admin import plain

router = APIRouter(
    prefix="/admin", dependencies=[Depends(require_admin)], route_class=IdentityBodyRoute
)
MAX_RESIDENCY_PAGE = 100  # most copies (and hot adapters) one /admin/residency answer lists


def _cache(deps: ServerDeps) -> CacheControl:
    if deps.cache is None:
        raise ApiError(503, "this server has no adapter cache", "server_error", "no_cache")
    return deps.cache


def _key(deps: ServerDeps, ref: str) -> AdapterKey:
    return deps.registry.get_revision(ref).key()


@router.get("/residency")
async def residency(
    deps: DepsDep,
    top: Annotated[int, Query(ge=0, le=MAX_RESIDENCY_PAGE)] = MAX_RESIDENCY_PAGE,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Any:
    """A page of at most ``top`` copies (most requested first, from ``offset``), the cache
    counters, the number of copies in all, and the ``top`` most requested adapters. ``top``
    above ``MAX_RESIDENCY_PAGE`` is a 400: a cache of thousands of copies is read in pages.
    NOTE: the snapshot is taken on the thread pool explicitly: it may wait on an engine process
    or on every replica of a fleet, and the event loop must never wait with it."""
    snapshot = await run_in_threadpool(_cache(deps).snapshot)
    ranked = sorted(snapshot.entries, key=lambda e: (-e.hits, e.key.ref, e.tier))
    hits: dict[str, int] = {}
    for entry in snapshot.entries:
        hits[entry.key.ref] = hits.get(entry.key.ref, 0) + entry.hits
    hot = sorted(hits.items(), key=lambda item: (-item[1], item[0]))[:top]
    return plain(
        {
            "entries": [_entry(asdict(e)) for e in ranked[offset : offset + top]],
            "num_entries": len(snapshot.entries),
            "stats": asdict(snapshot.stats),
            "num_loading": snapshot.num_loading,
            "num_blocked": snapshot.num_blocked,
            "hot": [{"model": ref, "hits": count} for ref, count in hot],
        }
    )


def _entry(raw: dict[str, Any]) -> dict[str, Any]:
    key = raw.pop("key")
    raw["model"] = f"{key['tenant']}/{key['name']}@{key['revision']}"
    raw["adapter_digest"] = key["adapter_digest"]
    return raw


async def _target(body: ResidencyBody, deps: ServerDeps) -> tuple[CacheControl, AdapterKey]:
    """The cache and the revision's key; a bad tier or reference is a 400 naming its field
    (``param`` was null), the tier refused before the registry is touched."""
    cache = _cache(deps)
    try:
        body.cache_tier()
    except ValueError as exc:
        raise invalid_request(str(exc), "tier") from None
    try:
        return cache, await run_in_threadpool(_key, deps, body.model)
    except ValueError as exc:  # not tenant/name@revision (an alias, a bare name)
        raise invalid_request(str(exc), "model") from None


async def _loading(future: Future[None], body: ResidencyBody) -> dict[str, object]:
    if body.wait:
        await asyncio.wrap_future(future)
    status = "resident" if future.done() else "loading"
    return {"model": body.model, "tier": body.cache_tier().name, "status": status}


@router.post("/residency/pin")
async def pin(body: ResidencyBody, deps: DepsDep) -> Any:
    """Keep the revision in ``tier`` (loading it first); pinned copies are never evicted."""
    cache, key = await _target(body, deps)
    return await _loading(await run_in_threadpool(cache.pin, key, body.cache_tier()), body)


@router.post("/residency/prefetch")
async def prefetch(body: ResidencyBody, deps: DepsDep) -> Any:
    """Load the revision into ``tier`` if the eviction policy finds it worth its victims."""
    cache, key = await _target(body, deps)
    return await _loading(await run_in_threadpool(cache.prefetch, key, body.cache_tier()), body)


@router.post("/residency/unpin")
async def unpin(body: ResidencyBody, deps: DepsDep) -> Any:
    """Lift the operator's pin; the answer says what holds the copy pinned still, if anything.
    NOTE: it said "unpinned" while a release's hold or a warm policy kept the copy pinned, and
    the operator's next unload was a 409 again."""
    cache, key = await _target(body, deps)
    tier = body.cache_tier()
    unpinned = await run_in_threadpool(cache.unpin, key, tier)
    warm = unpinned.warm
    if unpinned.owners:  # another owner holds the pin: the cache was not asked
        warm = (await run_in_threadpool(cache.holds, key, tier)).warm
    holders = held_by(unpinned.owners, warm)
    status = "still_pinned" if holders else ("unpinned" if unpinned.lifted else "not_pinned")
    return {
        "model": body.model,
        "tier": tier.name,
        "status": status,
        "lifted": unpinned.lifted,
        "held_by": holders,
    }


@router.post("/residency/evict")
async def evict(body: ResidencyBody, deps: DepsDep) -> Any:
    """Drop the copy in ``tier`` unless it is pinned, in use or loading; a copy not dropped
    comes with the reason, so a kept copy is not read as an absent one."""
    cache, key = await _target(body, deps)
    tier = body.cache_tier()
    answer: dict[str, object] = {"model": body.model, "tier": tier.name}
    answer["evicted"] = await run_in_threadpool(cache.evict, key, tier)
    if not answer["evicted"]:
        holds = await run_in_threadpool(cache.holds, key, tier)
        answer["reason"] = _kept(holds) if holds.resident else f"no copy in {tier.name}"
    return answer


def _kept(holds: CopyHolds) -> str:
    """Why an evict kept the copy, each hold named: ``kept: pinned by release; in use (2)``.
    NOTE: it said "kept: pinned, in use or loading", and the operator had to guess which."""
    # NOTE: a copy that became evictable between the two calls has no hold left to name
    return "kept: " + (holds_text(holds) or "nothing holds it now: try again")
