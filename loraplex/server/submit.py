"""A validated completion or chat body handed to the engine: the tenant charged for its fan-out,
its sampling fields checked, its model resolved and prompts encoded (one trip to the thread
pool, ``serving.prepare``), one ``EngineRequest`` per sibling with ``max_tokens`` fitted to each
prompt's context, each sibling's stream observed (``observed``) and merged (``choices.Fanout``).

The result is ``Started``, which ``routes_openai`` turns into the response.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from fastapi import Request

from loraplex.server.auth import TenantDep
from loraplex.server.choices import DEFAULT_MAX_CHOICES, Fanout, Shape, Sibling, shape_of, siblings
from loraplex.server.deps import ServerDeps
from loraplex.server.limits import charge_engine_requests
from loraplex.server.metrics import RequestObservation, ServerMetrics
from loraplex.server.observed import Observed, observe, start_trace
from loraplex.server.protocol import ChatCompletionRequest, SamplingFields
from loraplex.server.sampling_fields import check_sampling, fit_max_tokens, sampling_params
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
from loraplex.server.streaming import ChunkFormat
from loraplex.tracing.record import RequestTrace


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


async def start_request(
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
    sticky = sticky_key(request, body.user)  # a bad X-Session-Id is a 400 before any charge
    await charge_engine_requests(request, tenant, shape)
    vocab_size = deps.config.vocab_size
    check_sampling(body, budget.requested, vocab_size, rank_choices=shape.ranks)
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
