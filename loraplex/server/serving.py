"""From an authorised OpenAI request to its engine requests, shared by both endpoints: the ids
it carries, the revision that answers it, the tier that revision sits in on arrival, and each
prompt's ``EngineRequest``.

The tenant check is the registry's: ``resolve_revision`` decides which revision answers (or raises
the one 404 for anything the caller may not use). The engine only ever sees the resolved
``AdapterKey``. The streams are then observed (``observed``) and awaited while the client is
watched (``disconnect``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineRequest
from loraplex.errors import PromptTooLongError
from loraplex.registry import Revision, Tenant
from loraplex.residency.ledger import CACHED_TIERS, Tier
from loraplex.sampling import SamplingParams
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import invalid_request
from loraplex.server.protocol import RevisionInfo

REVISION_HEADER = "x-loraplex-revision"
TIER_HEADER = "x-loraplex-tier"


@dataclass(frozen=True)
class Target:
    """What answers a request: a resolved adapter revision or the base model."""

    model: str  # the ``model`` string the client sent (echoed in responses)
    adapter_key: AdapterKey | None  # None: the base model
    info: RevisionInfo  # what answered, with its tier (metrics and traces read it all)
    owned: bool  # the caller owns the revision (or the base model answers): it may see the tier
    rank: int | None = None  # the revision's largest rank (the request log); None: base model
    size_bytes: int | None = None  # its bytes once loaded (``estimated_bytes``); None: base

    @property
    def header(self) -> str:
        """Value of the revision header: ``tenant/name@revision``, or the base model's name."""
        return self.info.revision or self.model

    @property
    def reported(self) -> RevisionInfo:
        """``info`` as the caller sees it in every body and chunk: without the tier for another
        tenant's (public) revision, whose residency would tell who else used it lately."""
        if self.owned or self.info.tier is None:
            return self.info
        return self.info.model_copy(update={"tier": None})

    @property
    def headers(self) -> dict[str, str]:
        """Response headers: the revision, and its tier where ``reported`` has one: where it
        was cached on arrival until the engine reports the tier it leased from."""
        tier = self.reported.tier
        if tier is None:
            return {REVISION_HEADER: self.header}
        return {REVISION_HEADER: self.header, TIER_HEADER: tier}


SESSION_HEADER = "x-session-id"
MAX_SESSION_ID_CHARS = 256


def sticky_key(request: Request, user: str | None) -> str | None:
    """What keeps one caller on one revision during a release: the ``user`` field, else the
    ``X-Session-Id`` header (printable ASCII, at most 256 characters), else None.

    An empty ``user`` names no end user (as OpenAI's API, where clients that default the field
    to "" mean none): the header, else None, decides. The header is checked whenever it is sent,
    also when ``user`` wins, so a malformed one is never passed over in silence."""
    session = request.headers.get(SESSION_HEADER)
    if session is not None and (
        not 0 < len(session) <= MAX_SESSION_ID_CHARS
        or not session.isascii()
        or not session.isprintable()
    ):  # NOTE: isprintable() alone passed printable Latin-1 ("café"), the header is ASCII
        raise invalid_request(
            f"header X-Session-Id is invalid; expected 1 to {MAX_SESSION_ID_CHARS} printable "
            "ASCII characters",
            "X-Session-Id",
        )
    if user:
        return f"user:{user}"
    return None if session is None else f"session:{session}"


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128


def response_id(request: Request, generated: str) -> str:
    """The ``id`` the client sees: its ``X-Request-Id`` header (printable ASCII, at most 128
    characters), else ``generated``. NOTE: only the response id; engine request ids stay
    server-made, so no tenant can collide with (or abort) another's request by naming one."""
    chosen = request.headers.get(REQUEST_ID_HEADER)
    if chosen is None:
        return generated
    if not 0 < len(chosen) <= MAX_REQUEST_ID_CHARS or not (
        chosen.isascii() and chosen.isprintable()
    ):
        raise invalid_request(
            f"header X-Request-Id is invalid; expected 1 to {MAX_REQUEST_ID_CHARS} printable "
            "ASCII characters",
            "X-Request-Id",
        )
    return chosen


def max_model_len(deps: ServerDeps) -> int | None:
    """Prompt plus output tokens of one sequence; None: unknown here (the engine still ends a
    sequence at its own limit)."""
    return deps.config.max_model_len


def _resolve(
    deps: ServerDeps, tenant: Tenant, model: str, request_id: str, sticky_key: str | None
) -> Target:
    if model == deps.config.base_model_name:
        return Target(model, None, RevisionInfo(revision=None, adapter_digest=None), owned=True)
    revision: Revision = deps.registry.resolve_revision(
        tenant.name, model, request_id, sticky_key=sticky_key
    )
    info = RevisionInfo(revision=revision.ref, adapter_digest=revision.adapter_digest)
    owned = revision.tenant == tenant.name
    return Target(model, revision.key(), info, owned, revision.max_rank, revision.estimated_bytes)


@dataclass(frozen=True)
class Prepared:
    """What a request needs before it can reach the engine, from one trip to the thread pool."""

    target: Target  # the revision (or the base model) that answers it
    prompt_ids: list[list[int]]  # each prompt's token ids
    resolved_ns: int  # when ``target`` was resolved (``now_ns``'s clock): the resolution's end


async def prepare(
    deps: ServerDeps,
    tenant: Tenant,
    model: str,
    request_id: str,
    *,
    sticky_key: str | None,
    encode: Callable[[], list[list[int]]],
    now_ns: Callable[[], int] = time.time_ns,
) -> Prepared:
    """The revision ``model`` names for ``tenant`` (a database read), then the prompts' ids
    (``encode``: a long prompt must not stall the loop), both off the event loop in ONE trip to
    the thread pool: each trip wakes a worker and hands back to the loop, 0.5 ms at the median
    and several ms at the P98 on a shared 2-core machine for some 30 µs of registry work
    (docs/benchmarks/peer.md, "The loraplex side's tail"), and every request needs both.
    ``sticky_key``: the caller's ``user`` field or ``X-Session-Id`` header (release canaries
    keep one caller on one revision); None: the request id. A model that does not resolve raises
    before anything is tokenized."""

    def both() -> Prepared:
        target = _resolve(deps, tenant, model, request_id, sticky_key)
        resolved_ns = now_ns()
        return Prepared(target, encode(), resolved_ns)

    async with deps.jobs.place(tenant.name):  # tenant_jobs.py
        return await run_in_threadpool(both)


def engine_request(
    deps: ServerDeps,
    request_id: str,
    *,
    tenant: Tenant,
    target: Target,
    prompt_ids: list[int],
    params: SamplingParams,
    session_key: str | None = None,
) -> EngineRequest:
    if not prompt_ids:
        raise invalid_request("the prompt is empty; expected at least one token", "prompt")
    limit = deps.config.max_prompt_tokens
    if limit is not None and len(prompt_ids) > limit:  # permanent: retrying cannot help
        raise PromptTooLongError(
            f"the prompt has {len(prompt_ids)} tokens; expected at most {limit}"
        )
    return EngineRequest(
        request_id=request_id,
        tenant=tenant.name,
        adapter_key=target.adapter_key,
        prompt_token_ids=tuple(prompt_ids),
        params=params,
        deadline_s=deps.config.queue_deadline_s,
        session_key=session_key,
        stages=deps.config.request_log_path is not None,  # the request log writes them
    )


def arrival_tier(deps: ServerDeps, key: AdapterKey | None) -> Tier | None:
    """The fastest tier holding a ready copy of ``key`` now (L3: cached nowhere); None for the
    base model, or for an adapter outside GPU slots when there is no cache to ask. L0 also
    counts what the engine reports in slots (an engine without this cache)."""
    if key is None:
        return None
    cache = deps.cache
    if cache is not None and cache.is_resident(key, Tier.L0):
        return Tier.L0  # the common case, without building the engine's full load snapshot
    if key in deps.engine.load_snapshot().running_adapters:
        return Tier.L0
    if cache is None:
        return None
    return next((t for t in CACHED_TIERS[1:] if cache.is_resident(key, t)), Tier.L3)


def admit(deps: ServerDeps, target: Target) -> Target:
    """``target`` with the tier its adapter sits in on arrival (reported to the client unless
    the engine reports the tier it leased from, see ``submit.Started.confirmed``)."""
    tier = arrival_tier(deps, target.adapter_key)
    if tier is None:
        return target
    return replace(target, info=target.info.model_copy(update={"tier": tier.name}))
