"""The attacker tenant of ``bench serve``'s adversarial scenario: what it sends, and how.

At a bounded rate (open loop, at most ``max_in_flight`` requests open at once) it cycles through
four kinds of request, each a way one tenant hurt the others in issue 11:

- ``sampling``: values that pass a loose validation but break a batched sampler (``top_p`` 1e-46,
  ``temperature`` 1e-38, ``seed`` 2**70, NaN, ...), on its own ordinary adapter;
- ``oversized-prompt``: megabytes of prompt text (the server should answer 400/413 before it
  tokenizes, let alone stalls, anything);
- ``cold-adapter``: requests for its pathological adapters, uploaded through the admin API at the
  start of the run: a catastrophic-backtracking ``target_modules`` regex, a ~100 MB safetensors
  header, huge finite weights (registration refused, or requests for them failing alone);
- ``cancel``: streams dropped after their first tokens.

Every request and upload ends in an ``AttackRecord``: what the attacker got is part of the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.bench.serve.driver import prompt_ids
from loraplex.bench.sse_client import SseClientError, StreamingPost

ATTACKER = "attacker"  # the attacking tenant
ATTACKER_ADAPTER = "ok"  # its one ordinary adapter (registered with the victims' adapters)
KINDS = ("sampling", "oversized-prompt", "cold-adapter", "cancel")
# (detail, body fields): each passes the JSON parser; none should reach, let alone break, a step.
SAMPLING_VARIANTS: tuple[tuple[str, dict[str, object]], ...] = (
    ("top_p=1e-46", {"top_p": 1e-46}),
    ("temperature=1e-38", {"temperature": 1e-38}),
    ("seed=2**70", {"seed": 2**70, "temperature": 1.0}),
    ("seed=-2**70", {"seed": -(2**70), "temperature": 1.0}),
    ("temperature=5e-324", {"temperature": 5e-324}),
    ("temperature=NaN", {"temperature": math.nan}),
    ("max_tokens=2**63", {"max_tokens": 2**63}),
    ("prompt=[2**40]", {"prompt": [2**40]}),
)
CANCEL_AFTER_TOKENS = (1, 4)  # a cancelled stream is dropped after this many tokens
_PROMPT_TOKENS = 16  # prompt length of the attacker's ordinary requests
_MAX_TOKENS = 8  # their max_tokens (a cancelled stream asks for 64)


@dataclass(frozen=True)
class PathologicalAdapter:
    """One of the attacker's hostile adapters, written once and uploaded in every attacked run."""

    name: str  # adapter name ("regex", "huge-weights", "huge-header")
    path: Path  # directory holding adapter_config.json and adapter_model.safetensors


@dataclass(frozen=True)
class AttackPlan:
    """What the attacker does in one attacked run."""

    duration_s: float  # requests are sent over [0, duration_s) from the start of the run
    rate: float  # requests per second (the uploads come on top, once each)
    max_in_flight: int  # attacker requests open at once (later ones wait: a bounded attacker)
    prompt_bytes: int  # characters of every oversized prompt
    revision: str  # revision label the pathological adapters are registered under in this run
    timeout_s: float  # bound on every request and upload
    vocab_size: int  # prompt token ids are drawn below this
    seed: int  # prompt contents
    kinds: tuple[str, ...] = KINDS  # the kinds cycled through (a subset of KINDS, in its order)

    def __post_init__(self) -> None:
        unknown = [kind for kind in self.kinds if kind not in KINDS]
        if not self.kinds or unknown:
            raise ValueError(f"kinds {self.kinds} is invalid; expected a subset of {KINDS}")
        for name in (
            "duration_s",
            "rate",
            "max_in_flight",
            "prompt_bytes",
            "timeout_s",
            "vocab_size",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")


@dataclass(frozen=True)
class AttackRequest:
    """One scheduled attacker request."""

    kind: str  # one of KINDS
    detail: str  # which variant, e.g. "top_p=1e-46" or "regex"
    path: str  # /v1/completions or /v1/chat/completions
    body: bytes  # the encoded JSON body
    cancel_after_tokens: int | None  # drop the stream after this many tokens; None: read it all
    adapter: str | None  # cold-adapter: the pathological adapter to wait for the upload of


@dataclass(frozen=True)
class AttackRecord:
    """What one attacker request or upload got."""

    t_s: float  # scheduled send time, seconds from the start of the run
    kind: str  # one of KINDS, or "register" (an upload)
    detail: str  # the variant, or the uploaded adapter's name
    status: int  # HTTP status; 0: no response (timeout, reset connection)
    error: str | None  # error event type, or the first 200 characters of an error body


def schedule(plan: AttackPlan, adapters: tuple[PathologicalAdapter, ...]) -> list[AttackRequest]:
    """Request ``i`` is of kind ``plan.kinds[i % len(plan.kinds)]`` and cycles through that
    kind's variants."""
    rng = random.Random(plan.seed)
    text = _junk_text(rng, plan.prompt_bytes)
    ok = {"model": ATTACKER_ADAPTER, "max_tokens": _MAX_TOKENS}
    oversized = (  # encoded once each: a multi-MB prompt is not re-encoded per request
        _request("oversized-prompt", "text", "/v1/completions", {**ok, "prompt": text}),
        _request(
            "oversized-prompt",
            "chat",
            "/v1/chat/completions",
            {**ok, "messages": [{"role": "user", "content": text}]},
        ),
    )
    out = []
    for index in range(math.ceil(plan.duration_s * plan.rate - 1e-9)):
        kind, turn = plan.kinds[index % len(plan.kinds)], index // len(plan.kinds)
        prompt = prompt_ids(rng, _PROMPT_TOKENS, plan.vocab_size)
        base = {**ok, "prompt": prompt, "stream": True}
        if kind == "sampling":
            detail, fields = SAMPLING_VARIANTS[turn % len(SAMPLING_VARIANTS)]
            out.append(_request(kind, detail, "/v1/completions", {**base, **fields}))
        elif kind == "oversized-prompt":
            out.append(oversized[turn % len(oversized)])
        elif kind == "cold-adapter":
            name = adapters[turn % len(adapters)].name
            body = {**base, "model": f"{name}@{plan.revision}", "temperature": 0}
            out.append(_request(kind, name, "/v1/completions", body, adapter=name))
        else:
            after = CANCEL_AFTER_TOKENS[turn % len(CANCEL_AFTER_TOKENS)]
            body = {**base, "max_tokens": 64, "ignore_eos": True}
            out.append(_request(kind, f"after-{after}", "/v1/completions", body, cancel=after))
    return out


def _request(
    kind: str,
    detail: str,
    path: str,
    body: dict[str, object],
    *,
    cancel: int | None = None,
    adapter: str | None = None,
) -> AttackRequest:
    # json.dumps writes NaN as the bare NaN token, which Python's (and so FastAPI's) parser reads.
    encoded = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return AttackRequest(kind, detail, path, encoded, cancel, adapter)


def _junk_text(rng: random.Random, length: int) -> str:
    """``length`` characters of lowercase words: real tokenizer work, cheap to make."""
    table = bytes((b"abcdefghijklmnopqrstuvwxyz " * 10)[:256])
    return rng.randbytes(length).translate(table).decode("ascii")


async def run_attacker(
    url: str,
    key: str,
    admin_key: str,
    adapters: tuple[PathologicalAdapter, ...],
    plan: AttackPlan,
) -> list[AttackRecord]:
    """Uploads ``adapters`` (one after another, from the start) while sending the schedule;
    returns every record in send order. A cold-adapter request waits for its upload's answer."""
    start = time.monotonic()
    uploaded = {a.name: asyncio.Event() for a in adapters}
    gate = asyncio.Semaphore(plan.max_in_flight)

    async def one(index: int, request: AttackRequest) -> AttackRecord:
        t_s = (index + 0.5) / plan.rate
        await asyncio.sleep(max(0.0, start + t_s - time.monotonic()))
        if request.adapter is not None:
            await uploaded[request.adapter].wait()
        async with gate:
            status, error = await bounded_exchange(_exchange(url, key, request), plan.timeout_s)
        return AttackRecord(t_s, request.kind, request.detail, status, error)

    uploads = asyncio.create_task(_upload_all(url, admin_key, adapters, plan, uploaded))
    requests = await asyncio.gather(*(one(i, r) for i, r in enumerate(schedule(plan, adapters))))
    return sorted([*await uploads, *requests], key=lambda record: record.t_s)


@dataclass(frozen=True)
class MixedAttack:
    """``run_attacker`` as ``attack_process`` calls it (pickled into the attack's process)."""

    url: str  # the server
    key: str  # the attacker tenant's API key
    admin_key: str  # for the uploads of the pathological adapters
    adapters: tuple[PathologicalAdapter, ...]  # uploaded at the start
    plan: AttackPlan  # what it sends

    async def __call__(self, stop: asyncio.Event) -> list[AttackRecord]:
        """NOTE: ``stop`` is not awaited: the mixed attacker sends its whole schedule (bounded
        by ``plan.duration_s`` and its timeouts), as it did alongside the victims."""
        return await run_attacker(self.url, self.key, self.admin_key, self.adapters, self.plan)


async def bounded_exchange(
    exchange: Coroutine[Any, Any, tuple[int, str | None]], timeout_s: float
) -> tuple[int, str | None]:
    """(status, error) of ``exchange`` within ``timeout_s``; (0, why) without a reply."""
    try:
        return await asyncio.wait_for(exchange, timeout_s)
    except TimeoutError:
        return 0, "timeout"
    except (OSError, SseClientError, ValueError) as exc:  # ValueError: a malformed chunk
        return 0, type(exc).__name__


async def _exchange(url: str, key: str, request: AttackRequest) -> tuple[int, str | None]:
    if request.kind == "oversized-prompt":
        return await post_large(url, key, request)
    return await post_streaming(url, key, request)


async def post_streaming(url: str, key: str, request: AttackRequest) -> tuple[int, str | None]:
    """Sends ``request`` and reads its stream (to the end, or ``cancel_after_tokens`` events);
    (status, error event type or the first 200 characters of an error body)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with StreamingPost(url, request.path, json.loads(request.body), headers) as post:
        assert post.reply is not None  # read on entry
        if post.reply.status != 200:
            payload = await post.body()
            return post.reply.status, payload.decode("utf-8", errors="replace")[:200]
        tokens, error = 0, None
        async for line in post.lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                error = str(chunk["error"].get("type", "error"))
            tokens += 1
            if request.cancel_after_tokens is not None and tokens >= request.cancel_after_tokens:
                break  # leaving the block closes the connection mid-stream
        return post.reply.status, error


async def post_large(url: str, key: str, request: AttackRequest) -> tuple[int, str | None]:
    """POSTs a multi-MB body while reading the reply: a server that answers 413 before reading
    the whole body (as it should) and closes is seen answering, not as a reset connection."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = (
        f"POST {request.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(request.body)}\r\n"
        f"Authorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + request.body)
    sending = asyncio.ensure_future(writer.drain())
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise SseClientError(f"no reply head ({type(exc).__name__})") from exc
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await sending  # a reset connection fails the send: what counts is the reply
        writer.close()
    fields = raw.split(b" ", 2)
    if len(fields) < 2 or not fields[1].isdigit():
        raise SseClientError(f"malformed status line {raw[:80]!r}")
    status = int(fields[1])
    return status, None if status == 200 else f"HTTP {status}"


async def _upload_all(
    url: str,
    admin_key: str,
    adapters: tuple[PathologicalAdapter, ...],
    plan: AttackPlan,
    uploaded: dict[str, asyncio.Event],
) -> list[AttackRecord]:
    start, records = time.monotonic(), []
    for adapter in adapters:
        t_s = time.monotonic() - start
        try:
            # A thread: multipart-encoding a 100 MB file must not hold up the victims' client.
            status, error = await asyncio.to_thread(_upload, url, admin_key, adapter, plan)
        finally:
            uploaded[adapter.name].set()
        records.append(AttackRecord(t_s, "register", adapter.name, status, error))
    return records


def _upload(
    url: str, admin_key: str, adapter: PathologicalAdapter, plan: AttackPlan
) -> tuple[int, str | None]:
    form = {"tenant": ATTACKER, "name": adapter.name, "revision": plan.revision}
    try:
        with (
            (adapter.path / CONFIG_FILE).open("rb") as config,
            (adapter.path / WEIGHTS_FILE).open("rb") as weights,
        ):
            reply = httpx.post(
                f"{url}/admin/adapters/upload",
                data=form,
                files={"config": config, "weights": weights},
                headers={"Authorization": f"Bearer {admin_key}"},
                timeout=plan.timeout_s,
            )
    except httpx.TimeoutException:
        return 0, "timeout"
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__
    return reply.status_code, None if reply.is_success else reply.text[:200]
