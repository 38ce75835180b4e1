"""The OpenAI-compatible API: /v1/completions, /v1/chat/completions and /v1/models.

Every route authenticates a tenant key first; ``model`` is resolved by the registry for that
tenant only (no path or URL is ever accepted). Responses carry the revision that answered in the
``x-loraplex-revision`` header and the ``loraplex`` body field.

A generation request costs in this order: the prompts' lengths (``prompt_bounds``: by
``len()`` alone, before any per-token work), the schema's bounds (``protocol``), the sampling
fields and the prompt's characters (cheap, on the event loop), the model's resolution (the
registry's one 404), and only then the chat template and the tokenizer (on the thread pool), so
a caller cannot spend CPU on a prompt for a model it may not use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from loraplex.registry import Adapter, Revision
from loraplex.server.auth import DepsDep, TenantDep
from loraplex.server.chat import ChatMessage, num_prompt_chars
from loraplex.server.choices import (
    DEFAULT_MAX_CHOICES,
    ChoiceOutput,
    Echo,
    Fanout,
    Shape,
    Sibling,
    shape_of,
    siblings,
)
from loraplex.server.deps import ServerDeps
from loraplex.server.disconnect import ClientDisconnectedError, collect, start_stream
from loraplex.server.errors import invalid_request
from loraplex.server.limits import charge_engine_requests, check_prompt_chars
from loraplex.server.logprobs_format import TokenStrings
from loraplex.server.metrics import RequestObservation, ServerMetrics
from loraplex.server.observed import Observed, observe, start_trace
from loraplex.server.prompt_bounds import PromptLengthsDep
from loraplex.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    Prompt,
    SamplingFields,
    Usage,
)
from loraplex.server.responses import chat_choices, completion_choices
from loraplex.server.sampling_fields import (
    check_sampling,
    fit_max_tokens,
    output_logprobs,
    sampling_params,
)
from loraplex.server.serving import (
    Target,
    admit,
    engine_request,
    max_model_len,
    new_request_id,
    prepare,
    response_id,
    sticky_key,
)
from loraplex.server.stream_buffer import Backpressure, bounded
from loraplex.server.streaming import (
    ChunkFormat,
    StreamChoices,
    not_read_event,
    resumed_too_often_event,
    sse_events,
)
from loraplex.tracing.record import RequestTrace

router = APIRouter(prefix="/v1")
# nginx's status for "client closed the connection"; nobody reads it (the client is gone).
CLIENT_CLOSED_REQUEST = 499


@dataclass(frozen=True)
class Started:
    """A request handed to the engine (one engine request per choice, see ``choices.py``)."""

    response_id: str  # the id the client sees (its X-Request-Id, else the server-made id)
    target: Target  # the revision answering
    fanout: Fanout  # every sibling's output (each observed for metrics)
    fmt: ChunkFormat  # how its chunks look
    observations: tuple[RequestObservation, ...]  # per sibling: timing and the engine's tier
    shape: Shape  # prompts, n and best_of
    prompt_ids: list[list[int]]  # the tokenized prompts

    def confirmed(self) -> Started:
        """This request with the tier the engine found its adapter in, once it said so."""
        tier = next((o.engine_tier for o in self.observations if o.engine_tier), None)
        if tier is None or self.target.info.tier in (None, tier):
            return self
        target = replace(self.target, info=self.target.info.model_copy(update={"tier": tier}))
        fmt = ChunkFormat(
            self.fmt.request_id, self.fmt.created, self.fmt.model, target.reported, self.fmt.chat
        )
        return replace(self, target=target, fmt=fmt)

    @property
    def headers(self) -> dict[str, str]:
        return {**self.target.headers, "X-Request-Id": self.response_id}


def _metrics(request: Request) -> ServerMetrics:
    deps: ServerDeps = request.app.state.deps
    return deps.metrics


@dataclass(frozen=True)
class Budget:
    """What a request asked to generate per prompt."""

    requested: int | None  # its max_tokens; None: the rest of the context; 0: echo only
    param: str  # the field it came from (named in a 400)


async def _start(
    request: Request,
    deps: ServerDeps,
    tenant: TenantDep,
    *,
    body: SamplingFields,
    encode: Callable[[], list[list[int]]],
    num_prompts: int,
    budget: Budget,
) -> Started:
    chat = isinstance(body, ChatCompletionRequest)
    operation = "chat" if chat else "text_completion"  # the GenAI operation names
    trace = start_trace(request, deps, tenant, body.model, operation)
    try:
        return await _submit(
            request, deps, tenant, body, encode=encode, num_prompts=num_prompts,
            budget=budget, trace=trace,
        )  # fmt: skip
    except BaseException as exc:
        if trace is not None:
            trace.failed(exc)  # ends the trace unless a sibling still runs
        raise


async def _submit(
    request: Request,
    deps: ServerDeps,
    tenant: TenantDep,
    body: SamplingFields,
    *,
    encode: Callable[[], list[list[int]]],
    num_prompts: int,
    budget: Budget,
    trace: RequestTrace | None,
) -> Started:
    chat = isinstance(body, ChatCompletionRequest)
    engine_id = new_request_id("chatcmpl" if chat else "cmpl")  # never the client's
    client_id = response_id(request, engine_id)
    shape = shape_of(body, num_prompts, DEFAULT_MAX_CHOICES)
    await charge_engine_requests(request, tenant, shape.num_siblings)
    vocab_size = deps.config.vocab_size
    check_sampling(body, budget.requested, vocab_size, rank_choices=shape.ranks)
    sticky = sticky_key(request, body.user)
    resolve_ns = time.time_ns()
    now_ns = time.time_ns if trace is None else trace.now_ns
    prepared = await prepare(
        deps, tenant, body.model, engine_id, sticky_key=sticky, encode=encode, now_ns=now_ns
    )
    if trace is not None:
        trace.resolved(resolve_ns, prepared.target.info.revision, None, prepared.resolved_ns)
    prompt_ids = prepared.prompt_ids
    target = admit(deps, prepared.target)
    if trace is not None:
        trace.arrival_tier = target.info.tier
    per_prompt = []
    for ids in prompt_ids:
        limit = 1 if budget.requested == 0 else None  # echo only: one token, never shown
        fitted = limit or fit_max_tokens(
            budget.requested, len(ids), max_model_len(deps), budget.param
        )
        params = sampling_params(body, fitted, vocab_size, rank_choices=shape.ranks)
        req = engine_request(
            deps,
            engine_id,
            tenant=tenant,
            target=target,
            prompt_ids=ids,
            params=params,
            session_key=sticky,
        )
        per_prompt.append(req if trace is None else replace(req, traceparent=trace.traceparent))
    members, observations = [], []
    for slot, req in enumerate(siblings(engine_id, per_prompt, shape)):
        observation = observe(
            _metrics(request),
            tenant,
            target,
            client_id,
            sticky,
            prompt_tokens=len(req.prompt_token_ids),
            max_tokens=req.params.max_tokens,
        )
        stream = Observed(deps.engine.generate(req), observation, trace, req.request_id)
        members.append(Sibling(req.request_id, slot, stream))
        observations.append(observation)
    fanout = Fanout(deps.engine, members, show_prompt_only=budget.requested == 0)
    fmt = ChunkFormat(client_id, int(time.time()), body.model, target.reported, chat)
    return Started(client_id, target, fanout, fmt, tuple(observations), shape, prompt_ids)


async def _respond(
    request: Request, started: Started, body: SamplingFields, echo: list[Echo] | None
) -> tuple[Response | list[ChoiceOutput], Started]:
    """A streaming response, an empty one for a client that left, or every sibling's output;
    with ``started`` as the engine confirmed it (the tier it found the adapter in)."""
    shape, fanout = started.shape, started.fanout
    try:
        if not body.stream:
            outputs = await collect(request, fanout, shape.num_siblings)
            return outputs, started.confirmed()
        first = await start_stream(request, fanout)
    except ClientDisconnectedError:
        return Response(status_code=CLIENT_CLOSED_REQUEST, headers=started.headers), started
    started = started.confirmed()
    strings = TokenStrings(request.app.state.deps.engine.tokenizer)
    choices = StreamChoices(
        started.fmt, shape.best_of, output_logprobs(body), strings, echo,
        continuous_usage=body.continuous_usage,
    )  # fmt: skip
    events = sse_events(first, fanout, choices, shape.num_siblings, body.include_usage)
    config = request.app.state.deps.config
    backpressure = Backpressure(
        config.stream_pause_bytes,
        fanout.pause,
        fanout.resume,
        config.max_stream_resumes,
        resumed_too_often_event,
    )
    read_ahead = bounded(
        events, config.max_stream_buffer_bytes, not_read_event, fanout.abort, backpressure
    )
    return StreamingResponse(
        read_ahead, media_type="text/event-stream", headers=started.headers
    ), started


def _usage(outputs: list[ChoiceOutput], shape: Shape) -> Usage:
    """Each prompt once, every generated token (best_of's unreturned choices too: they were
    generated)."""
    num_prompt = sum(outputs[p * shape.best_of].prompt_tokens for p in range(shape.num_prompts))
    num_completion = sum(out.completion_tokens for out in outputs)
    return Usage(
        prompt_tokens=num_prompt,
        completion_tokens=num_completion,
        total_tokens=num_prompt + num_completion,
    )


def _prompts(prompt: Prompt) -> list[str] | list[list[int]]:
    """A request's prompts: one, or a batch (a list of texts or of token-id lists)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise invalid_request("prompt is an empty list; expected at least one prompt", "prompt")
    texts = [item for item in prompt if isinstance(item, str)]
    if len(texts) == len(prompt):
        return texts
    ids = [item for item in prompt if isinstance(item, int)]
    if len(ids) == len(prompt):
        return [ids]
    return [item for item in prompt if isinstance(item, list)]


def _prompt_encoder(
    deps: ServerDeps, prompts: list[str] | list[list[int]]
) -> Callable[[], list[list[int]]]:
    """Checks each text prompt's characters now; returns the tokenizing, run once the model is
    resolved."""
    for prompt in prompts:
        if isinstance(prompt, str):
            check_prompt_chars(len(prompt), deps.config.max_prompt_chars, "prompt")
    return lambda: [_prompt_ids(deps, p) for p in prompts]


def _prompt_ids(deps: ServerDeps, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return deps.engine.tokenizer.encode(prompt)
    vocab = deps.config.vocab_size
    if vocab is not None and any(not 0 <= token < vocab for token in prompt):
        raise invalid_request(f"prompt token ids must lie in [0, {vocab})", "prompt")
    return prompt


@router.post("/completions", response_model=None)
async def completions(
    request: Request,
    body: CompletionRequest,
    tenant: TenantDep,
    _lengths: PromptLengthsDep,  # NOTE: after the key, before the body's per-token validation
    deps: DepsDep,
) -> Response | CompletionResponse:
    prompts = _prompts(body.prompt)
    if body.max_tokens == 0 and not body.echo:
        raise invalid_request("max_tokens 0 is only allowed with echo true", "max_tokens")
    started = await _start(
        request,
        deps,
        tenant,
        body=body,
        encode=_prompt_encoder(deps, prompts),
        num_prompts=len(prompts),
        budget=Budget(body.max_tokens, "max_tokens"),
    )
    echo = (
        await run_in_threadpool(_echoes, deps, prompts, started.prompt_ids) if body.echo else None
    )
    result, started = await _respond(request, started, body, echo)
    if isinstance(result, Response):
        return result
    outputs = result
    strings = TokenStrings(deps.engine.tokenizer)
    return await _answer(
        started,
        outputs,
        CompletionResponse,
        lambda: completion_choices(outputs, started.shape, body.logprobs, echo, strings),
    )


def _echoes(
    deps: ServerDeps, prompts: list[str] | list[list[int]], ids: list[list[int]]
) -> list[Echo]:
    texts = [p if isinstance(p, str) else deps.engine.tokenizer.decode(p) for p in prompts]
    return [Echo(text, prompt_ids[0]) for text, prompt_ids in zip(texts, ids, strict=True)]


def _chat_encoder(deps: ServerDeps, body: ChatCompletionRequest) -> Callable[[], list[list[int]]]:
    """Checks the conversation's characters now; returns the rendering and tokenizing, run once
    the model is resolved."""
    template = deps.chat
    if template is None:
        raise invalid_request("the served model has no chat template; use /v1/completions")
    messages = [ChatMessage(m.role, m.text(), m.name) for m in body.messages]
    check_prompt_chars(num_prompt_chars(messages), deps.config.max_prompt_chars, "messages")
    tokenizer = deps.engine.tokenizer
    return lambda: [template.encode(messages, tokenizer, body.reasoning_effort)]


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    request: Request, body: ChatCompletionRequest, tenant: TenantDep, deps: DepsDep
) -> Response | ChatCompletionResponse:
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    started = await _start(
        request,
        deps,
        tenant,
        body=body,
        encode=_chat_encoder(deps, body),
        num_prompts=1,
        budget=Budget(body.max_completion_tokens or body.max_tokens, param),
    )
    result, started = await _respond(request, started, body, None)
    if isinstance(result, Response):
        return result
    outputs = result
    strings = TokenStrings(deps.engine.tokenizer)
    return await _answer(
        started, outputs, ChatCompletionResponse, lambda: chat_choices(outputs, body, strings)
    )


async def _answer(
    started: Started,
    outputs: list[ChoiceOutput],
    kind: type[CompletionResponse] | type[ChatCompletionResponse],
    choices: Callable[[], list[Any]],
) -> Response:
    """The non-streamed answer. NOTE: formatted on the thread pool (every token's string and top
    logprobs, then the JSON dump): 16 echoed prompts of 480 tokens with ``logprobs: 20`` make a
    4.6 MB answer on the demo model, and formatting it on the event loop stalled every other
    tenant's requests while it ran (docs/operations.md, *Limits per client*)."""
    fmt = started.fmt

    def reply() -> Response:
        usage = _usage(outputs, started.shape)
        answer = kind(
            id=fmt.request_id, created=fmt.created, model=fmt.model, choices=choices(),
            usage=usage, loraplex=fmt.info,
        )  # fmt: skip
        return Response(
            answer.model_dump_json(), media_type="application/json", headers=started.headers
        )

    return await run_in_threadpool(reply)


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
        created=0,
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
