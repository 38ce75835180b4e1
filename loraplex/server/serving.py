"""From an authorised OpenAI request to a running engine stream, shared by both endpoints.

The tenant check is the registry's: ``resolve_revision`` decides which revision answers (or raises
the one 404 for anything the caller may not use). The engine only ever sees the resolved
``AdapterKey``. Deltas pass through ``observed`` (metrics) and ``until_disconnect`` (aborting the
engine request when the client goes away).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.errors import PromptTooLongError
from loraplex.registry import Revision, Tenant
from loraplex.release.traffic import classify
from loraplex.residency.ledger import CACHED_TIERS, Tier
from loraplex.sampling import SamplingParams
from loraplex.server.auth import AUTHORIZATION_NS
from loraplex.server.choices import ChoiceOutput, Fanout, Slotted
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import invalid_request
from loraplex.server.metrics import RequestObservation, ServerMetrics
from loraplex.server.protocol import RevisionInfo
from loraplex.tracing.record import Interval, RequestTrace, Subject

REVISION_HEADER = "x-loraplex-revision"
TIER_HEADER = "x-loraplex-tier"
T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """What answers a request: a resolved adapter revision or the base model."""

    model: str  # the ``model`` string the client sent (echoed in responses)
    adapter_key: AdapterKey | None  # None: the base model
    info: RevisionInfo  # what answered, with its tier (metrics and traces read it all)
    owned: bool  # the caller owns the revision (or the base model answers): it may see the tier

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
    ``X-Session-Id`` header (printable ASCII, at most 256 characters), else None."""
    if user:
        return f"user:{user}"
    session = request.headers.get(SESSION_HEADER)
    if session is None:
        return None
    if not 0 < len(session) <= MAX_SESSION_ID_CHARS or not session.isprintable():
        raise invalid_request(
            f"header X-Session-Id is invalid; expected 1 to {MAX_SESSION_ID_CHARS} printable "
            "characters",
            "X-Session-Id",
        )
    return f"session:{session}"


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
    return Target(model, revision.key(), info, owned=revision.tenant == tenant.name)


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
    the engine reports the tier it leased from, see ``routes_openai.Started.confirmed``)."""
    tier = arrival_tier(deps, target.adapter_key)
    if tier is None:
        return target
    return replace(target, info=target.info.model_copy(update={"tier": tier.name}))


def observe(
    metrics: ServerMetrics,
    tenant: Tenant,
    target: Target,
    response_id: str,
    sticky_key: str | None = None,
    *,
    prompt_tokens: int = 0,
    max_tokens: int = 0,
) -> RequestObservation:
    """Starts timing a request; ``cold`` means its adapter was not in a GPU slot on arrival.
    ``sticky_key`` tells the alias owner's end users apart when a release is judged."""
    cold = target.adapter_key is not None and target.info.tier != Tier.L0.name
    return metrics.start_request(
        tenant.priority.value,
        cold,
        time.monotonic(),
        revision=target.info.revision,
        tenant=tenant.name,
        response_id=response_id,
        sticky_key=sticky_key,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
    )


TRACEPARENT_HEADER = "traceparent"


def start_trace(
    request: Request, deps: ServerDeps, tenant: Tenant, model: str, operation: str
) -> RequestTrace | None:
    """The request's trace (under the caller's W3C ``traceparent`` when valid); None when
    tracing is off."""
    tracing = deps.tracing
    if tracing is None:
        return None
    stamps = request.scope.get("state", {}).get(AUTHORIZATION_NS)
    authorization = None if stamps is None else Interval(*stamps)
    subject = Subject(operation, model, tenant.name, tenant.priority.value)
    return tracing.begin(request.headers.get(TRACEPARENT_HEADER), subject, authorization)


class Observed:
    """``stream`` unchanged, with TTFT / TPOT / outcome recorded; closing it closes ``stream``.
    With a ``trace``, the stream is one of its siblings (its deltas and its end are stamped).

    NOTE: a class, not an async generator: a generator closed before its first read (a sibling
    whose pump task was cancelled before it ran, when the request was aborted) never runs its
    ``finally``, and the request counted as arrived was never counted as ended."""

    def __init__(
        self,
        stream: AsyncIterator[TokenDelta],
        observation: RequestObservation,
        trace: RequestTrace | None = None,
        request_id: str = "",
    ) -> None:
        self._stream = stream
        self._observation = observation
        self._outcome = "error"  # the finish reason once the last delta came
        self._trace = trace
        self._sibling = None if trace is None else trace.submit(request_id)
        self._error: BaseException | None = None  # what the stream raised, if it did

    def __aiter__(self) -> Observed:
        return self

    async def __anext__(self) -> TokenDelta:
        try:
            delta = await anext(self._stream)
        except StopAsyncIteration:
            await self._end(self._outcome)  # no last delta: "error", as a failure
            raise
        except asyncio.CancelledError:
            await self.aclose()
            raise
        except Exception as exc:
            self._observation.fail(exc)  # decides whether the failure counts against its revision
            self._error = exc
            await self.aclose()
            raise
        self._observation.on_delta(delta, time.monotonic())
        if self._sibling is not None:
            self._sibling.on_delta(delta, time.time_ns())
        if delta.finish_reason is not None:
            self._outcome = delta.finish_reason
        return delta

    async def aclose(self) -> None:
        """Records the outcome (once): closed before its last delta, the client went away
        (``abort``), unless a failure was recorded (``error``)."""
        failed = self._observation.failed
        await self._end("abort" if self._outcome == "error" and not failed else self._outcome)

    async def _end(self, outcome: str) -> None:
        self._observation.finish(outcome)  # only the first call counts
        if self._trace is not None and self._sibling is not None:
            revision = self._observation.revision
            verdict = None if revision is None else classify(outcome, self._error).value
            self._trace.sibling_ended(self._sibling, outcome, self._error, verdict)
        with anyio.CancelScope(shield=True):
            await _aclose(self._stream)


async def _aclose(stream: AsyncIterator[TokenDelta]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


async def close_quietly(stream: AsyncIterator[TokenDelta]) -> None:
    """Closes a stream at once (not whenever the garbage collector gets to it)."""
    with anyio.CancelScope(shield=True):
        await _aclose(stream)


class ClientDisconnectedError(Exception):
    """The client closed the connection before its response was complete."""


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        continue


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientDisconnectedError (``work`` cancelled) if the client leaves
    first. Uvicorn does not cancel a handler whose client left, so waits must watch for it."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task})
    if task.cancelled():
        raise ClientDisconnectedError
    return task.result()


async def first_item(fanout: Fanout) -> Slotted | None:
    """The first delta of any sibling, awaited before any response byte is sent so that queue
    timeouts and load failures still get their own HTTP status (None: every stream ended at
    once). An error has already aborted every sibling (``Fanout``)."""
    try:
        return await anext(fanout)
    except StopAsyncIteration:
        return None


async def start_stream(request: Request, fanout: Fanout) -> Slotted | None:
    """The first delta (see ``first_item``); every sibling is aborted if the client leaves
    while they wait in the queue."""
    try:
        return await unless_disconnected(request, first_item(fanout))
    except ClientDisconnectedError:
        await fanout.abort()
        raise


async def _drain(fanout: Fanout, first: Slotted | None, outputs: list[ChoiceOutput]) -> None:
    item = first
    while item is not None:
        slot, delta = item
        outputs[slot].add(delta)
        item = await anext(fanout, None)
    await fanout.abort()  # every sibling ended: this only closes the streams


async def collect(request: Request, fanout: Fanout, num_slots: int) -> list[ChoiceOutput]:
    """The whole output of every sibling, by slot; ClientDisconnectedError if the client left
    first (every sibling is then aborted and its lease released)."""
    outputs = [ChoiceOutput() for _ in range(num_slots)]
    first = await start_stream(request, fanout)
    try:
        await unless_disconnected(request, _drain(fanout, first, outputs))
    except ClientDisconnectedError:
        await fanout.abort()
        raise
    return outputs
