"""The OpenAI-compatible generation API: /v1/completions and /v1/chat/completions (the model
list is ``routes_models``).

Every route authenticates a tenant key first; ``model`` is resolved by the registry for that
tenant only (no path or URL is ever accepted). Responses carry the revision that answered in the
``x-loraplex-revision`` header and the ``loraplex`` body field.

A generation request costs in this order: the prompts' lengths (``prompt_bounds``: by
``len()`` alone, before any per-token work), the schema's bounds (``protocol``), the sampling
fields and the prompt's characters (cheap, on the event loop), the model's resolution (the
registry's one 404), and only then the chat template and the tokenizer (on the thread pool), so
a caller cannot spend CPU on a prompt for a model it may not use. ``submit.start_request`` hands
the request to the engine; this module answers it (a stream, or one JSON body).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from loraplex.server.auth import DepsDep, TenantDep
from loraplex.server.choices import ChoiceOutput, Echo, Shape
from loraplex.server.disconnect import ClientDisconnectedError, collect, start_stream
from loraplex.server.errors import invalid_request
from loraplex.server.json_route import StrictJsonRoute
from loraplex.server.listeners.buffered import buffered_answers
from loraplex.server.logprobs_format import TokenStrings
from loraplex.server.prompt_bounds import PromptLengthsDep
from loraplex.server.prompts import chat_encoder, echoes, prompt_encoder, prompts_of
from loraplex.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    SamplingFields,
    Usage,
)
from loraplex.server.responses import chat_choices, completion_choices
from loraplex.server.sampling_fields import output_logprobs
from loraplex.server.stream_buffer import Backpressure, bounded
from loraplex.server.streaming import (
    StreamChoices,
    not_read_event,
    resumed_too_often_event,
    sse_events,
)
from loraplex.server.submit import Budget, Started, start_request

router = APIRouter(prefix="/v1", route_class=StrictJsonRoute)  # a repeated JSON key: 400
# nginx's status for "client closed the connection"; nobody reads it (the client is gone).
CLIENT_CLOSED_REQUEST = 499


async def _respond(
    request: Request,
    started: Started,
    body: SamplingFields,
    echo: list[Echo] | None,
    tenant: str,
) -> tuple[Response | list[ChoiceOutput], Started]:
    """A streaming response, an empty one for a client that left, or every sibling's output;
    with ``started`` as the engine confirmed it (the tier it found the adapter in). A stream's
    heavy events are formatted in ``tenant``'s places on the pool (``tenant_jobs.py``)."""
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
    deps = request.app.state.deps
    place = partial(deps.jobs.place, tenant)
    events = sse_events(first, fanout, choices, shape.num_siblings, body.include_usage, place=place)
    config = deps.config
    backpressure = Backpressure(
        config.stream_pause_bytes,
        fanout.pause,
        fanout.resume,
        config.max_stream_resumes,
        resumed_too_often_event,
    )
    read_ahead = bounded(
        events,
        config.max_stream_buffer_bytes,
        not_read_event,
        fanout.abort,
        backpressure,
        held=buffered_answers(request.scope.get("state", {})),  # counted with the transport's
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


@router.post("/completions", response_model=None)
async def completions(
    request: Request,
    body: CompletionRequest,
    tenant: TenantDep,
    _lengths: PromptLengthsDep,  # NOTE: after the key, before the body's per-token validation
    deps: DepsDep,
) -> Response | CompletionResponse:
    prompts = prompts_of(body.prompt)
    if body.max_tokens == 0 and not body.echo:
        raise invalid_request("max_tokens 0 is only allowed with echo true", "max_tokens")
    started = await start_request(
        request,
        deps,
        tenant,
        body=body,
        encode=prompt_encoder(deps, prompts),
        num_prompts=len(prompts),
        budget=Budget(body.max_tokens, "max_tokens"),
    )
    echo = None
    if body.echo:
        async with deps.jobs.place(tenant.name):  # a share of the pool (tenant_jobs.py)
            echo = await run_in_threadpool(echoes, deps, prompts, started.prompt_ids)
    result, started = await _respond(request, started, body, echo, tenant.name)
    if isinstance(result, Response):
        return result
    outputs = result
    strings = TokenStrings(deps.engine.tokenizer)
    return await _answer(
        deps.jobs.place(tenant.name),
        started,
        outputs,
        CompletionResponse,
        lambda: completion_choices(outputs, started.shape, body.logprobs, echo, strings),
    )


def _chat_budget(body: ChatCompletionRequest) -> Budget:
    """``max_completion_tokens``, else ``max_tokens`` (its older name; vLLM's rule). Both set and
    different is a 400 naming ``max_tokens``: it was dropped in silence."""
    chosen = body.max_completion_tokens
    if chosen is None:
        return Budget(body.max_tokens, "max_tokens")
    if body.max_tokens is not None and body.max_tokens != chosen:
        raise invalid_request(
            f"max_tokens {body.max_tokens} differs from max_completion_tokens {chosen}; expected "
            "one of them (max_tokens is its older name) or both the same",
            "max_tokens",
        )
    return Budget(chosen, "max_completion_tokens")


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    request: Request, body: ChatCompletionRequest, tenant: TenantDep, deps: DepsDep
) -> Response | ChatCompletionResponse:
    started = await start_request(
        request,
        deps,
        tenant,
        body=body,
        encode=chat_encoder(deps, body),
        num_prompts=1,
        budget=_chat_budget(body),
    )
    result, started = await _respond(request, started, body, None, tenant.name)
    if isinstance(result, Response):
        return result
    outputs = result
    strings = TokenStrings(deps.engine.tokenizer)
    return await _answer(
        deps.jobs.place(tenant.name),
        started,
        outputs,
        ChatCompletionResponse,
        lambda: chat_choices(outputs, body, strings),
    )


async def _answer(
    place: AbstractAsyncContextManager[None],
    started: Started,
    outputs: list[ChoiceOutput],
    kind: type[CompletionResponse] | type[ChatCompletionResponse],
    choices: Callable[[], list[Any]],
) -> Response:
    """The non-streamed answer. NOTE: formatted on the thread pool (every token's string and top
    logprobs, then the JSON dump): 16 echoed prompts of 480 tokens with ``logprobs: 20`` make a
    4.6 MB answer on the demo model, and formatting it on the event loop stalled every other
    tenant's requests while it ran (docs/operations.md, *Limits per client*). ``place``: one of
    the tenant's places on the pool (``tenant_jobs.py``)."""
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

    async with place:
        return await run_in_threadpool(reply)
