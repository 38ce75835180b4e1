"""The client side of ``loraplex bench peer``: the same requests, through the same client, to
whichever server runs (loraplex or vLLM), addressed through that server's ``Route`` table.

Streams go through ``serve_driver.send_one`` (the benchmarks' lean SSE client); the probes and
greedy comparisons read whole answers through the same ``StreamingPost``. Every request has a
timeout; a failed one is a record with ``ok`` False, never an exception.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from loraplex.bench.serve.driver import DriveConfig, RequestRecord, prompt_ids, send_one
from loraplex.bench.sse_client import SseClientError, StreamingPost
from loraplex.bench.workloads import TraceRequest, gamma_arrivals, zipf_weights

_FIRST_ANSWER_POLL_S = 0.2  # between two tries of the first adapter request


@dataclass(frozen=True)
class Route:
    """How one server names one model: the ``model`` string and the API key sent with it."""

    model: str  # loraplex: ``name@revision`` (the tenant's key says whose); vLLM: module name
    key: str  # bearer token: the owning tenant's key (loraplex) or the server's --api-key


@dataclass(frozen=True)
class BatchResult:
    """One batch of requests sent all at once."""

    records: tuple[RequestRecord, ...]  # one per request, in batch order
    wall_s: float  # from the first send to the last answer

    @property
    def completed(self) -> int:
        return sum(r.ok for r in self.records)

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens of the completed requests per wall second."""
        return sum(r.completion_tokens for r in self.records if r.ok) / self.wall_s

    @property
    def completed_per_s(self) -> float:
        return self.completed / self.wall_s


@dataclass(frozen=True)
class Shot:
    """One request of a batch or trace: when, to which route index, how long."""

    t_s: float  # arrival, seconds from the start (0 for a batch)
    route: int  # index into the routes the batch is sent over
    prompt: tuple[int, ...]  # prompt token ids
    output_tokens: int  # max_tokens (ignore_eos: every request generates all of them)


@dataclass(frozen=True)
class ShotShape:
    """What every batch and trace request of one invocation shares."""

    prompt_tokens: int  # prompt length
    output_tokens: int  # max_tokens (ignore_eos: every request generates all of them)
    vocab: int  # prompt ids are drawn below this


def batch_shots(
    num_requests: int, num_routes: int, shape: ShotShape, salt: str
) -> tuple[Shot, ...]:
    """``num_requests`` requests at t 0, cycling over the routes, with prompts of ``salt``."""
    rng = random.Random(salt)
    return tuple(
        Shot(0.0, i % num_routes, _prompt(rng, shape), shape.output_tokens)
        for i in range(num_requests)
    )


def zipf_trace(
    rate: float, num_requests: int, num_routes: int, shape: ShotShape, seed: int
) -> tuple[Shot, ...]:
    """WORKLOADS.md's zipf(1.0) popularity over the routes (route 0 the most popular) with
    Poisson arrivals at ``rate``, about ``num_requests`` long."""
    rng = random.Random(f"zipf-{seed}")
    times = gamma_arrivals(rng, rate, 1.0, num_requests / rate)
    picks = rng.choices(range(num_routes), zipf_weights(num_routes, 1.0), k=len(times))
    return tuple(
        Shot(t, pick, _prompt(rng, shape), shape.output_tokens)
        for t, pick in zip(times, picks, strict=True)
    )


def _prompt(rng: random.Random, shape: ShotShape) -> tuple[int, ...]:
    return tuple(prompt_ids(rng, shape.prompt_tokens, shape.vocab))


async def run_shots(
    url: str, routes: Sequence[Route], shots: Sequence[Shot], timeout_s: float
) -> BatchResult:
    """Every shot at its arrival time (open loop), streamed; one record per shot."""
    drive = DriveConfig(max_in_flight=max(1, len(shots)), request_timeout_s=timeout_s)
    start = time.monotonic()

    async def one(shot: Shot) -> RequestRecord:
        arrival = start + shot.t_s
        await asyncio.sleep(max(0.0, arrival - time.monotonic()))
        route = routes[shot.route]
        request = TraceRequest(shot.t_s, "peer", route.model, len(shot.prompt), shot.output_tokens)
        ids = list(shot.prompt)
        return await send_one(
            url, request, key=route.key, ids=ids, arrival=arrival, tier="L0", config=drive
        )

    records = await asyncio.gather(*(one(shot) for shot in shots))
    return BatchResult(tuple(records), time.monotonic() - start)


async def complete_text(
    url: str, route: Route, prompt: str | Sequence[int], max_tokens: int, timeout_s: float
) -> str | None:
    """The greedy answer's text (not streamed), or None when the request failed."""
    body = {
        "model": route.model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {route.key}"}

    async def ask() -> str | None:
        async with StreamingPost(url, "/v1/completions", body, headers) as post:
            assert post.reply is not None  # read on entry
            payload = await post.body()
            if post.reply.status != 200:
                return None
            text = json.loads(payload)["choices"][0]["text"]
            return text if isinstance(text, str) else None

    try:
        return await asyncio.wait_for(ask(), timeout_s)
    except (TimeoutError, OSError, SseClientError, ValueError, LookupError, TypeError):
        return None


async def first_answer(
    url: str, route: Route, prompt: str, max_tokens: int, deadline_s: float
) -> bool:
    """Retries one adapter request until it succeeds (True) or ``deadline_s`` (monotonic)
    passes (False)."""
    while time.monotonic() < deadline_s:
        remaining = deadline_s - time.monotonic()
        if await complete_text(url, route, prompt, max_tokens, max(0.1, remaining)) is not None:
            return True
        await asyncio.sleep(_FIRST_ANSWER_POLL_S)
    return False


# One whole-answer request: (route index, prompt text or token ids, max_tokens).
Ask = tuple[int, str | Sequence[int], int]


async def answers(
    url: str, routes: Sequence[Route], asks: Sequence[Ask], timeout_s: float
) -> list[str | None]:
    """The text of each ask, one request at a time (probes and greedy checks measure
    correctness, not speed)."""
    out = []
    for route, prompt, max_tokens in asks:
        out.append(await complete_text(url, routes[route], prompt, max_tokens, timeout_s))
    return out
