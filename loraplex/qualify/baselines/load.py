"""The comparators' clients: closed-loop load at one concurrency, the first answer of a fresh
server, and greedy probe completions (torch-free; streams through the bench's lean SSE client).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx

from loraplex.bench.serve.driver import DriveConfig, RequestRecord, prompt_ids, send_one
from loraplex.bench.workloads import TraceRequest
from loraplex.qualify.baselines.pricing import LoadLevel, Sample
from loraplex.qualify.baselines.server import TENANT, Running

REQUEST_TIMEOUT_S = 300.0  # one request's bound; a request past it fails (and counts)


@dataclass(frozen=True)
class LoadSpec:
    """What one closed-loop level sends."""

    concurrency: int  # clients at once, each sending its next request when one ends
    requests: int  # requests in all
    prompt_tokens: int  # random token ids per prompt (no two prompts share a prefix)
    output_tokens: int  # tokens per answer (ignore_eos: every answer runs to it)
    vocab_size: int  # ids are drawn below this
    seed: int  # prompt contents

    def __post_init__(self) -> None:
        for name in ("concurrency", "requests", "prompt_tokens", "output_tokens", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoadSpec.{name} must be >= 1, got {getattr(self, name)}")


def _sample(record: RequestRecord) -> Sample:
    return Sample(record.ok, record.ttft_s, record.tpot_s)


async def _one(server: Running, spec: LoadSpec, index: int, arrival: float) -> RequestRecord:
    rng = random.Random(f"{spec.seed}/{index}")
    ids = prompt_ids(rng, spec.prompt_tokens, spec.vocab_size)
    request = TraceRequest(0.0, TENANT, server.model, spec.prompt_tokens, spec.output_tokens)
    drive = DriveConfig(request_timeout_s=REQUEST_TIMEOUT_S, vocab_size=spec.vocab_size)
    return await send_one(
        server.url, request, key=server.key, ids=ids, arrival=arrival, tier="L0", config=drive
    )


async def _closed_loop(server: Running, spec: LoadSpec) -> LoadLevel:
    next_index = 0
    samples: list[Sample] = []

    async def client() -> None:
        nonlocal next_index
        while next_index < spec.requests:
            index, next_index = next_index, next_index + 1
            samples.append(_sample(await _one(server, spec, index, time.monotonic())))

    start = time.monotonic()
    await asyncio.gather(*(client() for _ in range(spec.concurrency)))
    return LoadLevel(spec.concurrency, time.monotonic() - start, tuple(samples))


def closed_loop(server: Running, spec: LoadSpec) -> LoadLevel:
    """``spec.requests`` requests from ``spec.concurrency`` clients; wall time from the first
    send to the last answer."""
    return asyncio.run(_closed_loop(server, spec))


def first_answer_s(server: Running, spec: LoadSpec) -> float:
    """Seconds from the server's launch to the first token of its first request (the cold
    start); RuntimeError when that request fails (no cold start was measured)."""
    record = asyncio.run(_one(server, spec, -1, server.launched_at))
    if not record.ok or record.ttft_s is None:
        raise RuntimeError(
            f"the first request to {server.url} failed: status {record.status}, "
            f"error {record.error!r} (log: {server.log_path})"
        )
    return record.ttft_s


@dataclass(frozen=True)
class Completion:
    """A greedy completion of a text prompt."""

    text: str  # the continuation
    prompt_tokens: int  # the prompt's length as the server tokenized it


def complete(server: Running, prompt: str, max_tokens: int) -> Completion:
    """Greedy completion of ``prompt`` by the served base model; RuntimeError on a non-200."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    headers = {"Authorization": f"Bearer {server.key}"}
    reply = httpx.post(
        server.url + "/v1/completions", json=body, headers=headers, timeout=REQUEST_TIMEOUT_S
    )
    if reply.status_code != 200:
        raise RuntimeError(f"completion failed with {reply.status_code}: {reply.text[:300]}")
    payload = reply.json()
    return Completion(payload["choices"][0]["text"], int(payload["usage"]["prompt_tokens"]))
