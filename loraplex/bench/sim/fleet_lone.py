"""Lone requests through a fleet's ingress for ``sim calibrate-fleet`` (and ``bench sim``'s
fleet passes): warming an adapter until a request reports it in a GPU slot (so the router's
affinity sends the rest to that replica), and one adapter's paced prefill and decode samples, as
the lone server's calibration paces its own (``calibrate_run.paced_requests``) and as ``bench
sim`` replays a fleet's trace (``bench/fleet/drive.replay``); requests not served from a slot,
or failed, are left out. Then the lone cold requests, each on an adapter of its own in no replica
yet, whose loads' stage seconds (the fleet's stage counters read around each) fit
``fleet_load_scale`` (``with_load_scale``: the fitted term, its source and the report's part)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from loraplex.bench.fleet.drive import replay
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, prompt_ids, send_one
from loraplex.bench.sim.calibrate_loads import LINK_STAGES
from loraplex.bench.sim.calibrate_run import paced_requests
from loraplex.bench.sim.validate import MAX_LORA_RANK
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter, TraceRequest
from loraplex.sim.calibrate_fleet import (
    LOAD_LINKS,
    MIN_STAGE_SAMPLES,
    FleetSample,
    fit_load_scale,
    stage_timed,
    ttft_load_ratios,
)
from loraplex.sim.cost_model import CostModel

TENANT = "fleetcal"  # the tenant of every lone request's adapter (never a trace's)
WARM_TRIES = 6  # requests per adapter until one is served from a GPU slot
COLD_PROMPT_TOKENS = 8  # a cold sample's prompt (one token out)
MAX_COLD_REQUESTS = 256  # each has an adapter of its own, registered before the fleet starts
COLD_REQUESTS = 12  # sim calibrate-fleet's lone cold requests (fleet_load_scale), by default
PASS_COLD_REQUESTS = 4  # bench sim's fleet passes' lone cold requests per pass, by default
COLD_RANKS = (8, MAX_LORA_RANK)  # the cold adapters' ranks, in turn


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


def lone_adapters() -> list[TraceAdapter]:
    """The lone requests' two adapters: rank 8 and the largest served rank, attention targets."""
    return [
        TraceAdapter(TENANT, f"r{rank}", rank, ATTENTION_TARGETS) for rank in (8, MAX_LORA_RANK)
    ]


def cold_adapters(count: int = PASS_COLD_REQUESTS) -> list[TraceAdapter]:
    """``count`` adapters for one lone cold request each (``cold_samples``), ranks
    ``COLD_RANKS`` in turn, attention targets: never warmed, so each is in no replica when its
    request comes (``bench sim``'s fleet passes deploy a fresh fleet each; ``sim
    calibrate-fleet`` sends each one request on its one fleet)."""
    return [
        TraceAdapter(TENANT, f"cold{i}-r{rank}", rank, ATTENTION_TARGETS)
        for i, rank in ((i, COLD_RANKS[i % len(COLD_RANKS)]) for i in range(count))
    ]


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


def warm_lone_samples(
    url: str, key: str, adapters: Sequence[TraceAdapter], sizes: Mapping[tuple[str, str], int],
    *, rng: random.Random, config: LoneConfig, drive: DriveConfig,
) -> tuple[list[FleetSample], int]:  # fmt: skip
    """Each of ``adapters`` in turn warmed (``warm_up``), then its lone samples
    (``lone_samples``; its bytes as served from ``sizes``): the samples, and the requests left
    out."""
    samples: list[FleetSample] = []
    left_out = 0
    for adapter in adapters:
        warm_up(url, key, adapter, rng=rng, drive=drive)
        nbytes = sizes[(adapter.tenant, adapter.name)]
        kept, lost = lone_samples(url, key, adapter, nbytes, config=config, drive=drive)
        samples += kept
        left_out += lost
    return samples, left_out


def check_cold_requests(count: int, name: str) -> None:
    """``count`` lone cold requests, refused naming ``name`` unless 0 (none: not measured) or
    enough for ``fit_load_scale`` (``MIN_STAGE_SAMPLES``) up to ``MAX_COLD_REQUESTS``."""
    if count != 0 and not MIN_STAGE_SAMPLES <= count <= MAX_COLD_REQUESTS:
        raise ValueError(
            f"{name} {count} is invalid; expected 0 (none) or {MIN_STAGE_SAMPLES} to "
            f"{MAX_COLD_REQUESTS} (fleet_load_scale is fitted on at least {MIN_STAGE_SAMPLES})"
        )


def load_stages(
    before: Mapping[str, float], after: Mapping[str, float]
) -> tuple[float, ...] | None:
    """The stage seconds per link (``LOAD_LINKS``) the fleet's stage counters (stage name ->
    total seconds, summed over the replicas) grew by; None when a counter fell (a replica left
    the sum) or none grew."""
    grown = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in {*before, *after}}
    if any(v < 0 for v in grown.values()):
        return None
    seconds = tuple(
        sum(grown.get(stage, 0.0) for stage in LINK_STAGES[link]) for link in LOAD_LINKS
    )
    return seconds if sum(seconds) > 0 else None


def cold_samples(
    url: str, key: str, adapters: list[tuple[TraceAdapter, int]], *, gap_s: float,
    rng: random.Random, drive: DriveConfig, evict: Callable[[TraceAdapter], None] | None = None,
    stages: Callable[[], Mapping[str, float]] | None = None,
) -> tuple[list[FleetSample], int]:  # fmt: skip
    """One lone request (``COLD_PROMPT_TOKENS`` in, one token out) on each of ``adapters``
    (adapter, its bytes as served), ``gap_s`` apart, each adapter in no replica yet: the
    samples of those the fleet reported from the store (L3) and timed, and the requests left
    out (failed, or found cached). ``evict``, when given, drops each adapter's GPU-slot copy
    right after its request (before the next gap), so each load meets the slots the first did.
    ``stages``, when given, reads the fleet's stage counters (``calibrate_loads.stage_totals``
    through the ingress: every replica's summed), before the first request and after each
    (before its eviction, which times no stage): a kept sample's ``load_stages_s`` is what they
    grew by, its load's stage seconds on the replica that loaded it (nothing else loads then;
    the cache records a load's stages before its waiters go on)."""
    samples = []
    totals = None if stages is None else stages()
    for adapter, nbytes in adapters:
        time.sleep(gap_s)  # lone: the previous request and its load have ended
        request = TraceRequest(0.0, adapter.tenant, adapter.name, COLD_PROMPT_TOKENS, 1)
        ids = prompt_ids(rng, COLD_PROMPT_TOKENS, drive.vocab_size)
        record = asyncio.run(
            send_one(url, request, key=key, ids=ids, arrival=time.monotonic(), tier="L0",
                     config=drive)
        )  # fmt: skip
        grown = None
        if stages is not None and totals is not None:
            before, totals = totals, stages()
            grown = load_stages(before, totals)
        if evict is not None:
            evict(adapter)
        if record.ok and record.ttft_s and record.tier == "L3":
            rank = min(adapter.rank, MAX_LORA_RANK)
            samples.append(
                FleetSample(COLD_PROMPT_TOKENS, rank, nbytes, record.ttft_s, cold=True,
                            load_stages_s=grown)
            )  # fmt: skip
    return samples, len(adapters) - len(samples)


def cold_report(model: CostModel, samples: Sequence[FleetSample], requests: int) -> dict[str, Any]:
    """The report's ``cold`` part: the requests sent, kept and stage-timed, each kept one's TTFT
    and load stage seconds, the stage fit's ratios (``fit_load_scale``; refused: why) and their
    spread, and beside them the TTFT-residual ratios of the fit before simstage
    (``ttft_load_ratios``) and their median."""
    colds = [s for s in samples if s.cold]
    ttft_ratios = ttft_load_ratios(model, colds)
    report: dict[str, Any] = {
        "requests": requests,
        "kept": len(colds),
        "left_out": requests - len(colds),
        "stage_timed": len(stage_timed(colds)),
        "ttft_s": [s.ttft_s for s in colds],
        "load_stages_s": [s.load_stages_s for s in colds],
        "links": list(LOAD_LINKS),
        "ttft_ratios": ttft_ratios,
        "ttft_ratio_median": statistics.median(ttft_ratios) if ttft_ratios else None,
    }
    try:
        fit = fit_load_scale(model, colds)
    except ValueError as exc:
        return {**report, "ratios": [], "fleet_load_scale": None, "refused": str(exc)}
    ratios = list(fit.ratios)
    quartiles = statistics.quantiles(ratios, n=4)  # at least MIN_STAGE_SAMPLES ratios
    spread = {
        "min": min(ratios), "p25": quartiles[0], "median": fit.scale, "p75": quartiles[2],
        "max": max(ratios),
    }  # fmt: skip
    return {
        **report, "ratios": ratios, "link_ratios": fit.link_ratios,
        "fleet_load_scale": fit.scale, "spread": spread,
    }  # fmt: skip


def with_load_scale(
    model: CostModel, samples: Sequence[FleetSample], requests: int, where: str
) -> tuple[CostModel, dict[str, Any]]:
    """``model`` (its fleet terms fitted) with ``fleet_load_scale`` fitted on ``samples``' cold
    ones (``requests`` were sent; ``fit_load_scale``) and its source, or without the key (said
    so in ``sources``: none sent, or too few kept with their stage seconds; a base file's own
    value never stays), and the report's ``cold`` part (``cold_report``)."""
    report = cold_report(model, samples, requests)
    scale = report["fleet_load_scale"]
    kept, timed = report["kept"], report["stage_timed"]
    if scale is not None:
        links = ", ".join(f"{k} {v:.3f}" for k, v in report["link_ratios"].items())
        text = (
            f"median over {timed} lone cold requests through the fleet ({requests} sent, "
            f"{requests - kept} left out: failed or found cached; {kept - timed} kept without "
            f"stage seconds), each on an adapter of its own in no replica, "
            f"{COLD_PROMPT_TOKENS} prompt tokens, 1 out, paced, after the contention rounds, "
            "of their load's stage seconds as the fleet's stage counters grew around each "
            "request over the load's lone price (sim/calibrate_fleet.fit_load_scale; ratios "
            f"{min(report['ratios']):.3f} to {max(report['ratios']):.3f}; per link {links}; "
            f"{where})"
        )
    elif requests == 0:
        text = (
            "not measured (--cold-requests 0): a fleet replica's loads cost fleet_cpu_scale "
            "times their lone price"
        )
    else:
        text = (
            f"not fitted: {timed} of {requests} lone cold requests kept with their load's "
            f"stage seconds ({kept} kept; failed or found cached otherwise), "
            f"{MIN_STAGE_SAMPLES} needed ({where}): a fleet replica's loads cost "
            "fleet_cpu_scale times their price"
        )
    sources = {**model.sources, "fleet_load_scale": text}
    return replace(model, fleet_load_scale=scale, sources=sources), report
