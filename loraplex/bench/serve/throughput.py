"""HTTP vs in-process throughput, and the server's capacity the trace rates derive from.

Throughput: the same saturating batch of prompts through the server over HTTP and through the
same engine driven from this process (no HTTP, no SSE, no auth). Both sides run the engine the
same way, in its own process (``engine_process = true``, ``loraplex serve``'s default): the
in-process side only swaps the HTTP front for direct ``EngineClient`` calls, so the ratio is the
cost of the HTTP layer, not of a GIL shared with the client (the engine on a thread of this
process would share it with the asyncio loop driving every stream). Both sides get the same
engine settings, the same torch thread count and the same warm adapters; rounds alternate between
them after one full-size warm-up round each (WORKLOADS.md: warm up, interleave, take medians), and
every round index has its own prompts (no side is helped by prefixes cached in an earlier round).
Rounds are long (``num_requests`` well above ``max_num_seqs``) so that a round's ramp-up and drain
weigh little against its steady state.

Capacity: completed requests per second of a saturating batch of trace-shaped requests (the
trace's prompt and output lengths, warm adapters) over HTTP, the ``bench serve`` traces' rates
being a fraction of it.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.bench.serve.driver import DriveConfig, RequestRecord, prompt_ids, send_one
from loraplex.bench.serve.fleet import Fleet, ServerOptions, serve_values, serving
from loraplex.bench.workloads import TraceRequest

if TYPE_CHECKING:
    from loraplex.artifacts.identity import AdapterKey
    from loraplex.engine.protocol import EngineClient


@dataclass(frozen=True)
class ThroughputConfig:
    """One side-by-side throughput measurement."""

    adapters: tuple[tuple[str, str], ...]  # (tenant, name) the requests cycle over (kept warm)
    num_requests: int = 256  # requests per throughput round, all submitted at once
    prompt_tokens: int = 64  # prompt length
    output_tokens: int = 32  # max tokens per request
    rounds: int = 2  # alternating rounds per side
    vocab_size: int = 4096  # prompt ids are drawn below this
    seed: int = 0  # prompt contents
    capacity_requests: int = 128  # requests per capacity round (HTTP only)
    capacity_output_tokens: int = 16  # max tokens per capacity request (the traces' length)
    capacity_rounds: int = 2  # capacity rounds (the median counts)

    def __post_init__(self) -> None:
        if not self.adapters:
            raise ValueError("adapters () is invalid; expected at least one (tenant, name)")
        for name in (
            "num_requests",
            "prompt_tokens",
            "output_tokens",
            "rounds",
            "capacity_requests",
            "capacity_output_tokens",
            "capacity_rounds",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")


@dataclass(frozen=True)
class ThroughputResult:
    """Completion tokens per second of each round, per side."""

    http_tokens_per_s: tuple[float, ...]  # over HTTP, per round
    offline_tokens_per_s: tuple[float, ...]  # engine driven from this process, per round
    http_failures: int  # HTTP requests that did not complete (capacity rounds included)
    capacity_rps: tuple[float, ...] = ()  # completed trace-shaped requests per second, per round
    http_requests: int = 0  # HTTP requests of the throughput rounds
    http_completed: int = 0  # of which completed
    offline_requests: int = 0  # in-process requests of the throughput rounds
    offline_completed: int = 0  # of which completed

    @property
    def ratio(self) -> float | None:
        """Median HTTP throughput over median in-process throughput; None when undefined."""
        if not self.offline_tokens_per_s or not self.http_tokens_per_s:
            return None
        offline = statistics.median(self.offline_tokens_per_s)
        return statistics.median(self.http_tokens_per_s) / offline if offline > 0 else None

    @property
    def capacity(self) -> float | None:
        """Median completed requests per second of the capacity rounds; None without any."""
        return statistics.median(self.capacity_rps) if self.capacity_rps else None


Batch = list[tuple[TraceRequest, list[int]]]


def _batch(config: ThroughputConfig, size: int, output_tokens: int, salt: str) -> Batch:
    """``size`` requests cycling over the adapters, with prompts of their own for ``salt``."""
    rng = random.Random(f"{config.seed}/{salt}")
    out = []
    for i in range(size):
        tenant, name = config.adapters[i % len(config.adapters)]
        request = TraceRequest(0.0, tenant, name, config.prompt_tokens, output_tokens)
        out.append((request, prompt_ids(rng, config.prompt_tokens, config.vocab_size)))
    return out


def _send(
    url: str,
    fleet: Fleet,
    request: TraceRequest,
    ids: list[int],
    *,
    start: float,
    drive: DriveConfig,
) -> Coroutine[None, None, RequestRecord]:
    key = fleet.keys[request.tenant]
    return send_one(url, request, key=key, ids=ids, arrival=start, tier="L0", config=drive)


async def _http_round(url: str, fleet: Fleet, batch: Batch) -> tuple[list[RequestRecord], float]:
    """Every request of ``batch`` at once; the records and the round's wall seconds."""
    drive = DriveConfig(max_in_flight=len(batch), request_timeout_s=300.0)
    start = time.monotonic()
    jobs = [_send(url, fleet, r, ids, start=start, drive=drive) for r, ids in batch]
    records: list[RequestRecord] = await asyncio.gather(*jobs)
    return records, time.monotonic() - start


async def _offline_round(
    engine: EngineClient,
    keys: dict[tuple[str, str], AdapterKey],
    batch: Batch,
    tag: str,
) -> tuple[float, int]:
    """Completion tokens per second of the completed requests, and how many completed (an
    engine error fails that request, as a non-200 fails an HTTP one)."""
    from loraplex.engine.protocol import EngineRequest
    from loraplex.errors import LoraplexError
    from loraplex.sampling import SamplingParams

    async def one(index: int, request: TraceRequest, ids: list[int]) -> int | None:
        params = SamplingParams(
            max_tokens=request.output_tokens, temperature=0.0, ignore_eos=True
        )  # same work as the HTTP side, which sends ignore_eos
        key = keys[(request.tenant, request.adapter)]
        job = EngineRequest(f"{tag}-{index}", request.tenant, key, tuple(ids), params)
        tokens = 0
        try:
            async for delta in engine.generate(job):
                tokens = delta.completion_tokens
        except LoraplexError:
            return None
        return tokens

    start = time.monotonic()
    counts = await asyncio.gather(*(one(i, r, ids) for i, (r, ids) in enumerate(batch)))
    done = [c for c in counts if c is not None]
    return sum(done) / (time.monotonic() - start), len(done)


def measure_throughput(
    fleet: Fleet, root: Path, options: ServerOptions, config: ThroughputConfig
) -> ThroughputResult:
    """The server's capacity over HTTP, then the server over HTTP and the same engine
    in-process, alternating, both kept warm."""
    import torch

    from loraplex.serve.assembly import build_server
    from loraplex.serve.config import merge

    torch.set_num_threads(options.torch_threads)
    values = serve_values(fleet, root / "in-process", options, 0)
    local = build_server(merge({}, {**values, "engine_process": True}))  # as `loraplex serve`
    http: list[float] = []
    offline: list[float] = []
    capacity: list[float] = []
    failures = http_completed = offline_completed = 0
    try:
        keys = {(t, n): local.registry.resolve(t, n) for t, n in config.adapters}
        with serving(fleet, root / "http", options) as url:
            warm = _batch(config, config.num_requests, config.output_tokens, "warm")
            asyncio.run(_http_round(url, fleet, warm))
            asyncio.run(_offline_round(local.engine, keys, warm, "warm"))
            for index in range(config.capacity_rounds):
                batch = _batch(
                    config,
                    config.capacity_requests,
                    config.capacity_output_tokens,
                    f"capacity-{index}",
                )
                records, wall = asyncio.run(_http_round(url, fleet, batch))
                capacity.append(sum(r.ok for r in records) / wall)
                failures += sum(not r.ok for r in records)
            for index in range(config.rounds):
                batch = _batch(config, config.num_requests, config.output_tokens, f"r{index}")
                records, wall = asyncio.run(_http_round(url, fleet, batch))
                http.append(sum(r.completion_tokens for r in records if r.ok) / wall)
                failures += sum(not r.ok for r in records)
                http_completed += sum(r.ok for r in records)
                rate, done = asyncio.run(_offline_round(local.engine, keys, batch, f"r{index}"))
                offline.append(rate)
                offline_completed += done
    finally:
        local.close()
    total = config.rounds * config.num_requests
    return ThroughputResult(
        tuple(http),
        tuple(offline),
        failures,
        tuple(capacity),
        http_requests=total,
        http_completed=http_completed,
        offline_requests=total,
        offline_completed=offline_completed,
    )
