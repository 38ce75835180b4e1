"""Issue 25's attacker kinds, each run on its own against a calm run (``serve_attack_runs``).

Unlike the four mixed kinds of ``serve_attacker`` (one attacker cycling through them at a bounded
rate), each of these is one way a single tenant, or an unauthenticated client, took the server
from the others in issue 25, sized as measured there:

- ``seat-hog``: 32 streaming requests held open at once (``max_tokens`` 480, ``ignore_eos``),
  each re-sent as it ends: every decoding seat of a 32-seat server;
- ``fanout``: 8 such streams with ``n`` 16 (128 sequences);
- ``token-id-batch``: one prompt batch of 16 prompts of 65,536 token ids per request (about
  4 MB of JSON, under the body cap), at the attack rate;
- ``half-open-flood`` and ``stuck-stream``: raw sockets (``serve_attack_sockets``);
- ``hung-engine``: the engine process stopped for a while (``serve_attack_hang``).

Every attack runs until ``stop`` is set (the victims' trace is over) and returns a tally of what
it got, which the per-kind report carries as is.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from loraplex.bench.serve.attacker import (
    ATTACKER_ADAPTER,
    AttackRequest,
    bounded_exchange,
    post_large,
    post_streaming,
)
from loraplex.bench.serve.driver import prompt_ids

SEAT_HOG, FANOUT, HALF_OPEN_FLOOD = "seat-hog", "fanout", "half-open-flood"
STUCK_STREAM, TOKEN_ID_BATCH, HUNG_ENGINE = "stuck-stream", "token-id-batch", "hung-engine"
ISOLATED_KINDS = (SEAT_HOG, FANOUT, HALF_OPEN_FLOOD, STUCK_STREAM, TOKEN_ID_BATCH, HUNG_ENGINE)

LONG_MAX_TOKENS = 480  # seat-hog, fanout and stuck-stream outputs (prompt + output fit 512)
SEAT_HOG_STREAMS = 32  # = the benchmark server's max_num_seqs
FANOUT_STREAMS, FANOUT_N = 8, 16
TOKEN_ID_PROMPTS, TOKEN_ID_LENGTH = 16, 65_536
PROMPT_TOKENS = 16  # prompt length of the attacker's generating requests
REFUSED_PAUSE_S = 0.1  # a held request refused (or unanswered) is re-sent after this pause

Tally = dict[str, Any]  # what an attack got: counts, status counts, measured seconds


@dataclass(frozen=True)
class KindTarget:
    """The server one attack runs against."""

    url: str  # its base URL
    key: str  # the attacker tenant's API key
    server_pid: int  # the server process (hung-engine signals its engine child)


@dataclass(frozen=True)
class KindPlan:
    """How hard each kind attacks (the fixed sizes above are issue 25's)."""

    duration_s: float  # the victims' trace length (hung-engine's stop starts within it)
    rate: float  # token-id-batch requests per second
    max_in_flight: int  # token-id-batch requests open at once
    flood_sockets: int  # half-open-flood: sockets held open at once
    hang_s: float  # hung-engine: seconds the engine stays stopped
    timeout_s: float  # bound on every request
    vocab_size: int  # prompt token ids are drawn below this
    seed: int  # prompt contents

    def __post_init__(self) -> None:
        for name in ("duration_s", "rate", "max_in_flight", "flood_sockets", "hang_s",
                     "timeout_s", "vocab_size"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")


Attack = Callable[[KindTarget, KindPlan, asyncio.Event], Coroutine[Any, Any, Tally]]


def long_stream(plan: KindPlan, index: int, **fields: object) -> AttackRequest:
    """A streaming request on the attacker's adapter that runs to ``LONG_MAX_TOKENS``."""
    rng = random.Random(plan.seed * 1_000_003 + index)
    body = {
        "model": ATTACKER_ADAPTER,
        "prompt": prompt_ids(rng, PROMPT_TOKENS, plan.vocab_size),
        "max_tokens": LONG_MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        **fields,
    }
    encoded = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return AttackRequest("long", str(index), "/v1/completions", encoded, None, None)


def token_id_batch(plan: KindPlan) -> AttackRequest:
    """``TOKEN_ID_PROMPTS`` prompts of ``TOKEN_ID_LENGTH`` ids each, in one request."""
    rng = random.Random(plan.seed)
    prompts = [prompt_ids(rng, TOKEN_ID_LENGTH, plan.vocab_size) for _ in range(TOKEN_ID_PROMPTS)]
    body = {"model": ATTACKER_ADAPTER, "prompt": prompts, "max_tokens": 8}
    encoded = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return AttackRequest(TOKEN_ID_BATCH, "16x65536", "/v1/completions", encoded, None, None)


def status_label(status: int, error: str | None) -> str:
    """As the mixed attacker counts: the status, or "200-error" for an error inside a 200."""
    return "200-error" if status == 200 and error is not None else str(status)


async def hold_open(
    count: int, send: Callable[[int], Awaitable[tuple[int, str | None]]], stop: asyncio.Event
) -> Tally:
    """Keeps ``count`` exchanges open until ``stop``, each re-sent as it ends (after
    ``REFUSED_PAUSE_S`` when refused: a bounded attacker, not a request flood)."""
    statuses: Counter[str] = Counter()

    async def worker(first: int) -> None:
        index = first
        while not stop.is_set():  # not ``while True``: see serve_attack_sockets' NOTE
            status, error = await send(index)
            statuses[status_label(status, error)] += 1
            index += count
            if status != 200:
                await asyncio.sleep(REFUSED_PAUSE_S)

    workers = [asyncio.create_task(worker(i)) for i in range(count)]
    await stop.wait()
    for task in workers:
        task.cancel()  # leaving a StreamingPost block closes its connection
    await asyncio.gather(*workers, return_exceptions=True)
    return {
        "held": count,
        "answered": sum(statuses.values()),
        "statuses": dict(sorted(statuses.items())),
    }


async def paced(
    plan: KindPlan, send: Callable[[], Awaitable[tuple[int, str | None]]], stop: asyncio.Event
) -> Tally:
    """Open loop: one exchange every ``1 / plan.rate`` seconds until ``stop``, at most
    ``plan.max_in_flight`` open at once (later ones wait for a place)."""
    statuses: Counter[str] = Counter()
    gate = asyncio.Semaphore(plan.max_in_flight)

    async def one() -> None:
        async with gate:
            status, error = await send()
        statuses[status_label(status, error)] += 1

    tasks: list[asyncio.Task[None]] = []
    start = time.monotonic()
    while not stop.is_set():
        due = start + (len(tasks) + 0.5) / plan.rate
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))
        except TimeoutError:
            tasks.append(asyncio.create_task(one()))
    unanswered = sum(not task.done() for task in tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"sent": len(tasks), "unanswered_at_stop": unanswered,
            "statuses": dict(sorted(statuses.items()))}  # fmt: skip


async def seat_hog(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    async def send(index: int) -> tuple[int, str | None]:
        request = long_stream(plan, index)
        return await bounded_exchange(
            post_streaming(target.url, target.key, request), plan.timeout_s
        )

    return await hold_open(SEAT_HOG_STREAMS, send, stop)


async def fanout(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    async def send(index: int) -> tuple[int, str | None]:
        request = long_stream(plan, index, n=FANOUT_N)
        return await bounded_exchange(
            post_streaming(target.url, target.key, request), plan.timeout_s
        )

    return await hold_open(FANOUT_STREAMS, send, stop)


async def token_ids(target: KindTarget, plan: KindPlan, stop: asyncio.Event) -> Tally:
    request = token_id_batch(plan)  # encoded once: about 4 MB

    async def send() -> tuple[int, str | None]:
        return await bounded_exchange(post_large(target.url, target.key, request), plan.timeout_s)

    return await paced(plan, send, stop)
