"""The decode samples of a calibration: each decode mix (``calibrate_run.mixes``) run
``repeats`` times, each run's TPOT timed on the engine's clock where the server's request log
is at hand (``--self``, ``bench sim``'s own calibration), else on the client's.

Why not the client's clock (issue 30; docs/simulator.md, "CALFAULT"): the client stamps a token
when its event loop reads the token's event. While the calibrating process does not run (a
loaded machine: its loop stalled 82 ms once while the server wrote one event per engine step
on time), the events queue in its socket and are read back to back when it runs again. A
stall over a request's first to last token left a TPOT of the parse time (6-27 us a token in
five kept calibrations), a stall over part of them a partial burst (140-694 us, beside real
steps of 1.18 ms and up) that no threshold can tell from a step. The request log's ``engine``
object holds the request's first step's end and its end on the engine's clock
(``calibrate_timeline.decode_tpot_s``): whenever the client read, that is the time the engine
took per token.

Without a request log (``--url``) the client's clock stays, and a request under
``BURST_TPOT_S`` is left out of its run (logged). Every run's TPOTs on both clocks, and what was
left out, are kept (``MixRecord``) for the report.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from loraplex.bench.serve.driver import RequestRecord, prompt_ids, send_one
from loraplex.bench.sim.calibrate_loads import into_slots
from loraplex.bench.sim.calibrate_run import (
    CalibrateConfig,
    drive_config,
    mixes,
    weight_regressors,
)
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
from loraplex.bench.sim.calibrate_timeline import decode_tpots, log_size, wait_for_lines
from loraplex.bench.workloads import TraceRequest
from loraplex.sim.calibrate import StepSample

# On the client's clock, a request whose TPOT is below this did not stream its tokens one
# engine step apart: the client read them together after a stall (module docstring), 6-27 us a
# token in issue 30's calibrations where every real step took >= 1.18 ms; it is left out.
# NOTE: a partial burst passes it; only the engine's clock has none.
BURST_TPOT_S = 100e-6
ENGINE_CLOCK = "engine"  # a run timed by the request log's engine timelines
CLIENT_CLOCK = "client"  # a run timed by the client's stamps

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixRun:
    """One run of a decode mix: its requests' TPOTs on both clocks."""

    seed: int  # its prompts' seed
    clock: str  # what ``tpot_s`` was timed by: ENGINE_CLOCK or CLIENT_CLOCK
    engine_tpots_s: tuple[float, ...]  # per logged request, in log order; empty: no log
    client_tpots_s: tuple[float, ...]  # per completed request, as the client stamped them
    bursts_s: tuple[float, ...]  # the client's under BURST_TPOT_S (left out on its clock)
    tpot_s: float | None  # the median on ``clock``, less what was left out; None: nothing left


@dataclass(frozen=True)
class MixRecord:
    """What one decode mix measured, kept for the report."""

    batch: int  # requests sent at once
    adapters: tuple[str, ...]  # its distinct adapters (``tenant/name@revision``)
    runs: tuple[MixRun, ...]  # its repeats, in order
    step_s: float | None  # its sample's step time, the median of the runs'; None: no sample


def mix_record(data: Mapping[str, Any]) -> MixRecord:
    """A ``MixRecord`` from a report's ``decode_mixes`` entry (``asdict`` of one, read back)."""
    runs = tuple(
        MixRun(
            int(r["seed"]),
            str(r["clock"]),
            tuple(r["engine_tpots_s"]),
            tuple(r["client_tpots_s"]),
            tuple(r["bursts_s"]),
            r["tpot_s"],
        )
        for r in data["runs"]
    )
    return MixRecord(int(data["batch"]), tuple(data["adapters"]), runs, data["step_s"])


def burst_tpots(tpots: Sequence[float]) -> list[float]:
    """The TPOTs of ``tpots`` below ``BURST_TPOT_S``: requests whose tokens were read together."""
    return [t for t in tpots if t < BURST_TPOT_S]


async def _send_mix(
    target: Target, batch: int, chosen: Sequence[ServedAdapter], config: CalibrateConfig, seed: int
) -> list[RequestRecord]:
    """``batch`` requests over ``chosen`` sent at once, each ``output_tokens`` long."""
    rng = random.Random(seed)
    drive = drive_config(target, config)
    now = time.monotonic()
    sends = []
    for i in range(batch):
        adapter = chosen[i % len(chosen)]
        request = TraceRequest(
            0.0, adapter.tenant, adapter.name, config.prompt_tokens, config.output_tokens
        )
        ids = prompt_ids(rng, config.prompt_tokens, target.vocab_size)
        key = target.keys[adapter.tenant]
        sends.append(
            send_one(target.url, request, key=key, ids=ids, arrival=now, tier="L0", config=drive)
        )
    return await asyncio.gather(*sends)


def mix_run(
    target: Target, batch: int, chosen: Sequence[ServedAdapter], config: CalibrateConfig, seed: int
) -> MixRun:
    """One run of a mix, timed on the engine's clock when the request log holds its requests,
    else on the client's less its bursts (logged)."""
    log = target.request_log
    offset = log_size(log)
    records = asyncio.run(_send_mix(target, batch, chosen, config, seed))
    client = tuple(r.tpot_s for r in records if r.ok and r.tpot_s is not None)
    bursts = tuple(burst_tpots(client))
    engine: tuple[float, ...] = ()
    if log is not None and log.is_file():
        completed = sum(1 for r in records if r.ok)
        lines = wait_for_lines(log, offset, completed, config.output_tokens)
        engine = tuple(decode_tpots(lines, config.prompt_tokens, config.output_tokens))
    if engine:
        return MixRun(seed, ENGINE_CLOCK, engine, client, bursts, statistics.median(engine))
    if bursts:
        _log.warning(
            "decode mix (batch %d, %d adapters, seed %d): %d of %d requests left out, their "
            "tokens were read together (client TPOT %s s < %s s)",
            batch,
            len(chosen),
            seed,
            len(bursts),
            len(client),
            bursts,
            BURST_TPOT_S,
        )
    kept = [t for t in client if t >= BURST_TPOT_S]
    tpot = statistics.median(kept) if kept else None
    return MixRun(seed, CLIENT_CLOCK, engine, client, bursts, tpot)


def step_samples(
    client: httpx.Client, target: Target, config: CalibrateConfig
) -> tuple[list[StepSample], list[MixRecord]]:
    """One sample per mix (its adapters prefetched into L0 first): the median over the mix's
    repeats of their TPOT, so one disturbed run (a loaded machine) does not make a sample of
    its own; and every mix's record, a mix without a sample too."""
    samples, records = [], []
    for index, (batch, chosen) in enumerate(mixes(target.adapters, config)):
        into_slots(client, target.adapters, chosen)
        runs = tuple(
            mix_run(target, batch, chosen, config, config.seed + 1000 * index + repeat)
            for repeat in range(config.repeats)
        )
        tpots = [r.tpot_s for r in runs if r.tpot_s is not None and r.tpot_s > 0]
        step_s = statistics.median(tpots) if tpots else None
        records.append(MixRecord(batch, tuple(a.ref for a in chosen), runs, step_s))
        if step_s is None:
            continue
        rows = [chosen[i % len(chosen)] for i in range(batch)]
        byte_tokens, widths = weight_regressors(rows)
        rank_tokens = sum(a.rank for a in rows)
        samples.append(
            StepSample(batch, 0, len(chosen), rank_tokens, step_s, False, byte_tokens, widths)
        )
    return samples, records


def decode_report(records: Sequence[MixRecord]) -> dict[str, object]:
    """The report's account of the decode samples: the clock(s) they were timed on, the rule
    for the client's, and what it left out, mix by mix (``mixes``)."""
    runs = [r for m in records for r in m.runs]
    clocks = sorted({r.clock for r in runs})
    return {
        "clocks": clocks,
        "rule": (
            "engine clock: (end_s - first_step_end_s) / (tokens - 1) of each request's "
            "request-log line, nothing left out; client clock: a request whose TPOT is under "
            "burst_tpot_s is left out of its run (its tokens were read together)"
        ),
        "burst_tpot_s": BURST_TPOT_S,
        "client_bursts": sum(len(r.bursts_s) for r in runs),
        "left_out": sum(len(r.bursts_s) for r in runs if r.clock == CLIENT_CLOCK),
        "mixes_without_sample": sum(1 for m in records if m.step_s is None),
    }


def decode_clock_text(records: Sequence[MixRecord]) -> str:
    """The clock(s) the decode samples were timed on, for the model's ``sources.step``."""
    runs = [r for m in records for r in m.runs]
    engine = sum(1 for r in runs if r.clock == ENGINE_CLOCK)
    left_out = sum(len(r.bursts_s) for r in runs if r.clock == CLIENT_CLOCK)
    parts = []
    if engine:
        parts.append(
            f"{engine} of {len(runs)} runs on the engine's clock: the request log's end_s less "
            "first_step_end_s per token after the first"
        )
    if engine < len(runs):
        parts.append(
            f"{len(runs) - engine} runs on the client's clock, {left_out} requests under "
            f"{BURST_TPOT_S * 1e6:g} us a token left out (read together)"
        )
    return "; ".join(parts) + "; bench/sim/calibrate_decode.py"
