"""The client side of ``loraplex bench serve``: open-loop replay of a trace over HTTP.

Each trace request is sent at its (scaled) arrival time as a streaming /v1/completions call with
the tenant's own key; TTFT runs from the scheduled arrival to the first streamed token (so time
spent waiting for a client connection counts too), TPOT over the tokens after it. The tier the
adapter sat in at arrival is the server's own answer (``x-loraplex-tier`` header / the
``loraplex.tier`` field) where it gives one; otherwise it comes from /admin/residency, polled in
the background, and ``RESIDENCY_POLL_S`` bounds how stale that view can be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import httpx

from loraplex.bench.sse_client import SseClientError, StreamingPost
from loraplex.bench.workloads import TraceRequest

RESIDENCY_POLL_S = 1.0
TIER_HEADER = "x-loraplex-tier"  # the server's tier at arrival (absent on older servers)
REVISION = "r1"  # the revision label every benchmark adapter is registered under
TIERS = ("L0", "L1", "L2", "L3")
_FIRST_TOKEN_ID = 4  # below: the tokenizer's special tokens


@dataclass(frozen=True)
class DriveConfig:
    """How one trace is replayed."""

    time_scale: float = 1.0  # wall seconds per trace second
    max_in_flight: int = 128  # open requests at once per tenant (bounded concurrency)
    request_timeout_s: float = 60.0  # every request ends within this
    vocab_size: int = 4096  # prompt token ids are drawn below this
    seed: int = 0  # prompt contents

    def __post_init__(self) -> None:
        for name in ("time_scale", "max_in_flight", "request_timeout_s", "vocab_size"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")


@dataclass(frozen=True)
class RequestRecord:
    """What one replayed request did."""

    t_s: float  # scheduled arrival, wall seconds from the start of the replay
    tenant: str  # requesting tenant
    adapter: str  # adapter name within the tenant
    tier: str  # tier of the adapter at arrival: L0, L1, L2 or L3 (nowhere cached)
    status: int  # HTTP status; 0: no response (timeout or transport error)
    ttft_s: float | None  # arrival to first token; None without one
    tpot_s: float | None  # mean seconds per output token after the first; None below 2 tokens
    completion_tokens: int  # tokens received
    revision: str | None  # the revision the server reported
    error: str | None  # error type or body, None on success
    reply_s: float | None = None  # arrival to the reply's status line; None without a reply
    # The error's ``code`` (a refused reply's body, or a stream's error event: e.g.
    # ``context_length_exceeded``); None without one. ``bench sim`` keys ``refused`` by it,
    # as the simulator does (``sim/refusal.py``).
    code: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass
class ResidencyView:
    """The latest /admin/residency: model ref -> fastest ready tier, and hit ratios over time."""

    tiers: dict[str, str] = field(default_factory=dict)  # tenant/name@revision -> tier name
    hit_series: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # (t_s, hits)
    final: dict[str, object] = field(default_factory=dict)  # the last snapshot's stats

    def tier_of(self, tenant: str, adapter: str, revision: str) -> str:
        return self.tiers.get(f"{tenant}/{adapter}@{revision}", "L3")

    def update(self, payload: dict[str, object], t_s: float) -> None:
        best: dict[str, str] = {}
        entries = payload.get("entries", [])
        for entry in entries if isinstance(entries, list) else []:
            if entry.get("ready"):
                model, tier = str(entry["model"]), str(entry["tier"])
                if TIERS.index(tier) < TIERS.index(best.get(model, "L3")):
                    best[model] = tier
        self.tiers = best
        stats = payload.get("stats")
        if isinstance(stats, dict):
            hits = {str(k): int(v) for k, v in stats.get("hits", {}).items()}
            hits["L3"] = int(stats.get("misses", 0))
            self.hit_series.append((t_s, hits))
            self.final = stats


async def poll_once(
    client: httpx.AsyncClient, admin_key: str, view: ResidencyView, start: float
) -> None:
    """One /admin/residency read into ``view`` (an error keeps the old view)."""
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        reply = await client.get("/admin/residency", params={"top": 0}, headers=headers)
        if reply.status_code == 200:
            view.update(reply.json(), time.monotonic() - start)
    except httpx.HTTPError:
        pass


async def poll_residency(
    client: httpx.AsyncClient,
    admin_key: str,
    view: ResidencyView,
    start: float,
    stop: asyncio.Event,
) -> None:
    """Refreshes ``view`` every RESIDENCY_POLL_S until ``stop``."""
    while not stop.is_set():
        await poll_once(client, admin_key, view, start)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RESIDENCY_POLL_S)


def prompt_ids(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    return [rng.randrange(_FIRST_TOKEN_ID, vocab_size) for _ in range(length)]


@dataclass
class _Stream:
    """Progress of one streamed response."""

    first_s: float | None = None  # monotonic time of the first token
    last_s: float | None = None  # monotonic time of the latest token
    tokens: int = 0  # completion tokens (usage chunk, else text chunks)
    revision: str | None = None  # loraplex.revision of the chunks
    tier: str | None = None  # the server's tier at arrival; None when it does not say
    error: str | None = None  # an error event's message
    code: str | None = None  # the error's ``code`` (``error_code``)
    reply_s: float | None = None  # monotonic time the reply's status line arrived


def _consume(line: str, stream: _Stream) -> None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line[len("data: ") :])
    if "error" in chunk:
        stream.error = str(chunk["error"].get("type", "error"))
        stream.code = error_code(chunk)
        return
    info = chunk.get("loraplex") or {}
    stream.revision = info.get("revision", stream.revision)
    stream.tier = info.get("tier") or stream.tier
    if chunk.get("usage"):
        stream.tokens = int(chunk["usage"]["completion_tokens"])
        return
    if any(choice.get("text") or choice.get("finish_reason") for choice in chunk["choices"]):
        now = time.monotonic()
        stream.first_s = stream.first_s or now
        stream.last_s = now
        stream.tokens += 1


MAX_CODE_CHARS = 64  # an error code kept at most (the server's are short snake_case names)


def error_code(body: object) -> str | None:
    """The ``code`` of an OpenAI-style error body (``{"error": {"code": ...}}``); None when it
    has none (or not a short string). NOTE: the body's text was kept only as ``error`` (its
    first 200 characters, where a long message could push the code out)."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and 0 < len(code) <= MAX_CODE_CHARS else None


async def _send(url: str, key: str, body: dict[str, object], stream: _Stream) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    async with StreamingPost(url, "/v1/completions", body, headers) as post:
        assert post.reply is not None  # read on entry
        stream.reply_s = time.monotonic()
        if post.reply.status != 200:
            payload = await post.body()
            stream.error = payload.decode("utf-8", errors="replace")[:200]
            with contextlib.suppress(ValueError):  # not JSON (a proxy's page): no code
                stream.code = error_code(json.loads(payload))
            return post.reply.status
        stream.tier = post.reply.headers.get(TIER_HEADER)
        async for line in post.lines():
            _consume(line, stream)
        return post.reply.status


async def send_one(
    url: str,
    request: TraceRequest,
    *,
    key: str,
    ids: list[int],
    arrival: float,
    tier: str,
    config: DriveConfig,
) -> RequestRecord:
    body = {
        "model": request.adapter,
        "prompt": ids,
        "max_tokens": request.output_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM's extension: every response runs to max_tokens (the trace sets the work).
        "ignore_eos": True,
    }
    stream, status = _Stream(), 0
    try:
        status = await asyncio.wait_for(_send(url, key, body, stream), config.request_timeout_s)
    except TimeoutError:
        stream.error = "timeout"
    except (OSError, SseClientError) as exc:
        stream.error = type(exc).__name__
    ttft = None if stream.first_s is None else stream.first_s - arrival
    tpot = None
    if stream.first_s is not None and stream.last_s is not None and stream.tokens > 1:
        tpot = (stream.last_s - stream.first_s) / (stream.tokens - 1)
    reported = stream.tier if stream.tier in TIERS else None
    return RequestRecord(
        arrival,
        request.tenant,
        request.adapter,
        reported or tier,
        status,
        ttft,
        tpot,
        stream.tokens,
        stream.revision,
        stream.error,
        None if stream.reply_s is None else stream.reply_s - arrival,
        stream.code,
    )


async def replay_over_http(
    url: str,
    requests: Sequence[TraceRequest],
    keys: dict[str, str],
    admin_key: str,
    config: DriveConfig,
) -> tuple[list[RequestRecord], ResidencyView]:
    """Replays ``requests`` open-loop against ``url``; one record per request, in trace order.

    Every tenant is a client of its own (its own ``max_in_flight`` bound), as on a real
    platform: one tenant's backlog of open requests (a storm's) never holds back another
    tenant's requests on the client side, where the server could not be blamed or credited.
    Streams use ``sse_client`` (a connection each; cheap on the shared cores)."""
    prompts = seeded_prompts(requests, config)
    view, stop = ResidencyView(), asyncio.Event()
    timeout = httpx.Timeout(config.request_timeout_s)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as admin:
        start = time.monotonic()
        poller = asyncio.create_task(poll_residency(admin, admin_key, view, start, stop))

        def tier_of(request: TraceRequest) -> str:
            return view.tier_of(request.tenant, request.adapter, REVISION)

        try:
            records = await send_on_schedule(
                url, requests, keys, config, start=start, tier_of=tier_of, prompts=prompts
            )
        finally:
            stop.set()
            await poller
        # One last look, so the final counters include the last requests.
        await poll_once(admin, admin_key, view, start)
    return records, view


def seeded_prompts(requests: Sequence[TraceRequest], config: DriveConfig) -> list[list[int]]:
    """Each request's prompt, from ``config.seed``: every run of a trace sends the same prompts."""
    rng = random.Random(config.seed)
    return [prompt_ids(rng, r.prompt_tokens, config.vocab_size) for r in requests]


async def send_on_schedule(
    url: str,
    requests: Sequence[TraceRequest],
    keys: dict[str, str],
    config: DriveConfig,
    *,
    start: float,
    tier_of: Callable[[TraceRequest], str],
    prompts: Sequence[list[int]],
) -> list[RequestRecord]:
    """Sends each of ``requests`` (its prompt in ``prompts``) at its arrival after ``start``
    (``t_s`` times ``config.time_scale``), with at most ``config.max_in_flight`` of a tenant's
    open at once; ``tier_of`` says the tier its adapter was in at arrival. One record per
    request, in trace order, ``t_s`` from ``start``."""
    gates = {t: asyncio.Semaphore(config.max_in_flight) for t in {r.tenant for r in requests}}

    async def run(index: int, request: TraceRequest) -> RequestRecord:
        arrival = start + request.t_s * config.time_scale
        await asyncio.sleep(max(0.0, arrival - time.monotonic()))
        tier = tier_of(request)
        async with gates[request.tenant]:
            record = await send_one(
                url,
                request,
                key=keys[request.tenant],
                ids=prompts[index],
                arrival=arrival,
                tier=tier,
                config=config,
            )
        return replace(record, t_s=record.t_s - start)

    return list(await asyncio.gather(*(run(i, r) for i, r in enumerate(requests))))
