"""Lone requests through a fleet's ingress for ``sim calibrate-fleet``: warming an adapter
until a request reports it in a GPU slot (so the router's affinity sends the rest to that
replica), and one adapter's paced prefill and decode samples, as the lone server's calibration
paces its own (``calibrate_run.paced_requests``) and as ``bench sim`` replays a fleet's trace
(``bench/fleet/drive.replay``); requests not served from a slot, or failed, are left out."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from loraplex.bench.fleet.drive import replay
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, prompt_ids, send_one
from loraplex.bench.sim.calibrate_run import paced_requests
from loraplex.bench.sim.validate import MAX_LORA_RANK
from loraplex.bench.workloads import TraceAdapter, TraceRequest
from loraplex.sim.calibrate_fleet import FleetSample

WARM_TRIES = 6  # requests per adapter until one is served from a GPU slot
COLD_PROMPT_TOKENS = 8  # a cold sample's prompt (one token out)
MAX_COLD_REQUESTS = 256  # each has an adapter of its own, registered before the fleet starts


class LoneConfig(Protocol):
    """What the lone samples read of ``calibrate_fleet.FleetCalibrateConfig``."""

    @property
    def requests(self) -> int: ...
    @property
    def prefill_lengths(self) -> tuple[int, ...]: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def hop_gap_s(self) -> float: ...
    @property
    def hop_output_tokens(self) -> int: ...


async def _lone(
    url: str, key: str, adapter: TraceAdapter, *, length: int, rng: random.Random,
    drive: DriveConfig,
) -> str:  # fmt: skip
    """One request of one token, to warm ``adapter``: the tier the fleet served it from."""
    request = TraceRequest(0.0, adapter.tenant, adapter.name, length, 1)
    ids = prompt_ids(rng, length, drive.vocab_size)
    record = await send_one(
        url, request, key=key, ids=ids, arrival=time.monotonic(), tier="L3", config=drive
    )
    return record.tier


def _paced(
    url: str, key: str, adapter: TraceAdapter, *, length: int, tokens: int,
    config: LoneConfig, drive: DriveConfig,
) -> list[RequestRecord]:  # fmt: skip
    """``config.requests`` lone requests on ``adapter``, paced (module docstring), replayed as
    ``bench sim`` replays a trace through a fleet (``bench/fleet/drive.replay``)."""
    requests = paced_requests(
        adapter.tenant, adapter.name, length, count=config.requests, gap_s=config.hop_gap_s,
        output_tokens=tokens,
    )  # fmt: skip
    return asyncio.run(replay(url, requests, {adapter.tenant: key}, drive))


def _warm(record: RequestRecord) -> bool:
    """Served from a GPU slot, and timed."""
    return record.ok and record.ttft_s is not None and record.tier == "L0"


def lone_samples(
    url: str, key: str, adapter: TraceAdapter, nbytes: int, *,
    config: LoneConfig, drive: DriveConfig,
) -> tuple[list[FleetSample], int]:  # fmt: skip
    """One adapter's prefill and decode samples, and the requests left out."""
    rank = min(adapter.rank, MAX_LORA_RANK)
    samples: list[FleetSample] = []
    records: list[RequestRecord] = []
    for index, length in enumerate(config.prefill_lengths):
        seeded = replace(drive, seed=drive.seed + 100 * index + rank)
        tokens = config.hop_output_tokens
        group = _paced(url, key, adapter, length=length, tokens=tokens, config=config, drive=seeded)
        records += group
        samples += [
            FleetSample(length, rank, nbytes, r.ttft_s) for r in group if _warm(r) and r.ttft_s
        ]
    seeded = replace(drive, seed=drive.seed + 7 + rank)
    group = _paced(
        url, key, adapter, length=8, tokens=config.output_tokens, config=config, drive=seeded
    )
    records += group
    samples += [
        FleetSample(8, rank, nbytes, r.ttft_s, r.tpot_s)
        for r in group
        if _warm(r) and r.ttft_s and r.tpot_s
    ]
    return samples, len(records) - len(samples)


def warm_up(
    url: str, key: str, adapter: TraceAdapter, *, rng: random.Random, drive: DriveConfig
) -> bool:
    """Requests until one is served from a GPU slot (at most ``WARM_TRIES``); False: none was."""
    for _ in range(WARM_TRIES):
        if asyncio.run(_lone(url, key, adapter, length=8, rng=rng, drive=drive)) == "L0":
            return True
    return False


def cold_samples(
    url: str, key: str, adapters: list[tuple[TraceAdapter, int]], *, gap_s: float,
    rng: random.Random, drive: DriveConfig, evict: Callable[[TraceAdapter], None] | None = None,
) -> tuple[list[FleetSample], int]:  # fmt: skip
    """One lone request (``COLD_PROMPT_TOKENS`` in, one token out) on each of ``adapters``
    (adapter, its bytes as served), ``gap_s`` apart, each adapter in no replica yet: the
    samples of those the fleet reported from the store (L3) and timed, and the requests left
    out (failed, or found cached). ``evict``, when given, drops each adapter's GPU-slot copy
    right after its request (before the next gap), so each load meets the slots the first did."""
    samples = []
    for adapter, nbytes in adapters:
        time.sleep(gap_s)  # lone: the previous request and its load have ended
        request = TraceRequest(0.0, adapter.tenant, adapter.name, COLD_PROMPT_TOKENS, 1)
        ids = prompt_ids(rng, COLD_PROMPT_TOKENS, drive.vocab_size)
        record = asyncio.run(
            send_one(url, request, key=key, ids=ids, arrival=time.monotonic(), tier="L0",
                     config=drive)
        )  # fmt: skip
        if evict is not None:
            evict(adapter)
        if record.ok and record.ttft_s and record.tier == "L3":
            rank = min(adapter.rank, MAX_LORA_RANK)
            samples.append(FleetSample(COLD_PROMPT_TOKENS, rank, nbytes, record.ttft_s, cold=True))
    return samples, len(adapters) - len(samples)
