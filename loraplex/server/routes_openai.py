"""The OpenAI-compatible API: /v1/completions, /v1/chat/completions and /v1/models.

Every route authenticates a tenant key first; ``model`` is resolved by the registry for that
tenant only (no path or URL is ever accepted). Responses carry the revision that answered in the
``x-loraplex-revision`` header and the ``loraplex`` body field.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from loraplex.engine.protocol import TokenDelta
from loraplex.registry import Adapter
from loraplex.server.auth import DepsDep, TenantDep
from loraplex.server.chat import ChatMessage
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import invalid_request
from loraplex.server.limits import check_prompt_chars
from loraplex.server.metrics import RequestObservation, ServerMetrics
from loraplex.server.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    SamplingFields,
    Usage,
)
from loraplex.server.sampling_fields import sampling_params
from loraplex.server.serving import (
    ClientDisconnectedError,
    Collected,
    Target,
    admit,
    collect,
    engine_request,
    new_request_id,
    observe,
    observed,
    resolve_target,
    start_stream,
    sticky_key,
)
from loraplex.server.streaming import ChunkFormat, sse_events

router = APIRouter(prefix="/v1")
# nginx's status for "client closed the connection"; nobody reads it (the client is gone).
CLIENT_CLOSED_REQUEST = 499


@dataclass(frozen=True)
class Started:
    """A request handed to the engine."""

    request_id: str  # response id and engine request id
    target: Target  # the revision answering
    stream: AsyncIterator[TokenDelta]  # its output (observed for metrics)
    fmt: ChunkFormat  # how its chunks look
    observation: RequestObservation  # its timing, and the tier the engine reports

    def confirmed(self) -> Started:
        """This request with the tier the engine found its adapter in, once it said so."""
        tier = self.observation.engine_tier
        if tier is None or self.target.info.tier in (None, tier):
            return self
        info = self.target.info.model_copy(update={"tier": tier})
        fmt = ChunkFormat(
            self.fmt.request_id, self.fmt.created, self.fmt.model, info, self.fmt.chat
        )
        return replace(self, target=replace(self.target, info=info), fmt=fmt)


def _metrics(request: Request) -> ServerMetrics:
    deps: ServerDeps = request.app.state.deps
    return deps.metrics


async def _start(
    request: Request,
    deps: ServerDeps,
    tenant: TenantDep,
    *,
    body: SamplingFields,
    encode: Callable[[], list[int]],
    max_tokens: int | None,
    chat: bool,
) -> Started:
    request_id = new_request_id("chatcmpl" if chat else "cmpl")
    params = sampling_params(body, max_tokens)
    prompt_ids = await run_in_threadpool(encode)  # a long prompt must not stall the loop
    sticky = sticky_key(request, body.user)
    target = admit(deps, await resolve_target(deps, tenant, body.model, request_id, sticky))
    engine_req = engine_request(
        deps, request_id, tenant=tenant, target=target, prompt_ids=prompt_ids, params=params
    )
    observation = observe(_metrics(request), tenant, target, request_id)
    stream = observed(deps.engine.generate(engine_req), observation)
    fmt = ChunkFormat(request_id, int(time.time()), body.model, target.info, chat)
    return Started(request_id, target, stream, fmt, observation)


async def _respond(
    request: Request, deps: ServerDeps, started: Started, body: SamplingFields
) -> tuple[Response | Collected, Started]:
    """A streaming response, an empty one for a client that left, or the collected output;
    with ``started`` as the engine confirmed it (the tier it found the adapter in)."""
    try:
        if not body.stream:
            collected = await collect(request, started.stream, deps, started.request_id)
            return collected, started.confirmed()
        first = await start_stream(request, started.stream, deps, started.request_id)
    except ClientDisconnectedError:
        return Response(status_code=CLIENT_CLOSED_REQUEST, headers=started.target.headers), started
    started = started.confirmed()
    events = sse_events(first, started.stream, started.fmt, body.include_usage, deps)
    headers = started.target.headers
    return StreamingResponse(events, media_type="text/event-stream", headers=headers), started


def _usage(collected: Collected) -> Usage:
    total = collected.prompt_tokens + collected.completion_tokens
    return Usage(
        prompt_tokens=collected.prompt_tokens,
        completion_tokens=collected.completion_tokens,
        total_tokens=total,
    )


def _prompt_ids(deps: ServerDeps, prompt: str | list[str] | list[int]) -> list[int]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if all(isinstance(item, str) for item in prompt):
        if len(prompt) != 1:
            raise invalid_request(f"{len(prompt)} prompts given; expected exactly 1", "prompt")
        text = str(prompt[0])
        check_prompt_chars(len(text), deps.config.max_prompt_chars, "prompt")
        return deps.engine.tokenizer.encode(text)
    ids = [int(item) for item in prompt]
    vocab = deps.config.vocab_size
    if vocab is not None and any(not 0 <= token < vocab for token in ids):
        raise invalid_request(f"prompt token ids must lie in [0, {vocab})", "prompt")
    return ids


@router.post("/completions", response_model=None)
async def completions(
    request: Request, body: CompletionRequest, tenant: TenantDep, deps: DepsDep
) -> Response | CompletionResponse:
    started = await _start(
        request,
        deps,
        tenant,
        body=body,
        encode=lambda: _prompt_ids(deps, body.prompt),
        max_tokens=body.max_tokens,
        chat=False,
    )
    result, started = await _respond(request, deps, started, body)
    if isinstance(result, Response):
        return result
    choice = CompletionChoice(text=result.text, finish_reason=result.finish_reason)
    fmt = started.fmt
    reply = CompletionResponse(
        id=fmt.request_id,
        created=fmt.created,
        model=fmt.model,
        choices=[choice],
        usage=_usage(result),
        loraplex=fmt.info,
    )
    return _json(reply, started)


def _chat_ids(deps: ServerDeps, body: ChatCompletionRequest) -> list[int]:
    if deps.chat is None:
        raise invalid_request("the served model has no chat template; use /v1/completions")
    messages = [ChatMessage(m.role, m.text(), m.name) for m in body.messages]
    num_chars = sum(len(m.content) for m in messages)
    check_prompt_chars(num_chars, deps.config.max_prompt_chars, "messages")
    return deps.chat.encode(messages, deps.engine.tokenizer)


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    request: Request, body: ChatCompletionRequest, tenant: TenantDep, deps: DepsDep
) -> Response | ChatCompletionResponse:
    max_tokens = body.max_completion_tokens or body.max_tokens
    started = await _start(
        request,
        deps,
        tenant,
        body=body,
        encode=lambda: _chat_ids(deps, body),
        max_tokens=max_tokens,
        chat=True,
    )
    result, started = await _respond(request, deps, started, body)
    if isinstance(result, Response):
        return result
    choice = ChatChoice(
        message=ChatMessageOut(content=result.text), finish_reason=result.finish_reason
    )
    fmt = started.fmt
    reply = ChatCompletionResponse(
        id=fmt.request_id,
        created=fmt.created,
        model=fmt.model,
        choices=[choice],
        usage=_usage(result),
        loraplex=fmt.info,
    )
    return _json(reply, started)


def _json(reply: CompletionResponse | ChatCompletionResponse, started: Started) -> Response:
    headers = started.target.headers
    return Response(reply.model_dump_json(), media_type="application/json", headers=headers)


def _card(adapter: Adapter, caller: str, base: str) -> ModelCard:
    own = adapter.tenant == caller
    return ModelCard(
        id=adapter.name if own else adapter.ref,
        created=int(adapter.created_at),
        owned_by=adapter.tenant,
        root=adapter.ref,
        parent=base,
    )


def _base_card(deps: ServerDeps) -> ModelCard:
    name = deps.config.base_model_name
    return ModelCard(id=name, created=0, owned_by="loraplex", root=name, parent=None)


@router.get("/models")
def list_models(tenant: TenantDep, deps: DepsDep) -> ModelList:
    """The base model and exactly the adapters the caller may use (its own and public ones)."""
    adapters = deps.registry.usable_adapters(tenant.name)
    base = deps.config.base_model_name
    cards = [_base_card(deps), *(_card(a, tenant.name, base) for a in adapters)]
    return ModelList(data=cards)


@router.get("/models/{model:path}")
async def get_model(model: str, tenant: TenantDep, deps: DepsDep) -> ModelCard:
    """One model the caller may use; the registry's one 404 for anything else."""
    if model == deps.config.base_model_name:
        return _base_card(deps)
    revision = await run_in_threadpool(deps.registry.resolve_revision, tenant.name, model)
    adapter = await run_in_threadpool(deps.registry.get_adapter, revision.tenant, revision.name)
    return _card(adapter, tenant.name, deps.config.base_model_name)
