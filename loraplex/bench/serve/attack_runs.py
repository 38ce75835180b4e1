"""Issue 25's attacker kinds, each against its own calm run: (calm, attacked) pairs of the
adversarial scenario's victims' trace, one pair per kind and round, each run on a fresh server.

Within a round the kinds' pairs alternate their order (calm first for even ``kind + round``),
so over the kinds and rounds neither side always runs on the fresher machine state. Both runs of
a pair replay the same trace with the same prompts, timed by the same client clock, and measure
the server process tree's resident memory at the same two points: once ``/ready`` answers, and
when the victims' last request has ended (the attack still running: for stuck-stream, the
streams still stuck).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loraplex.bench.proc_tree import tree_cpu_s, tree_rss_bytes
from loraplex.bench.serve.adversarial import ADVERSARIAL, AdversarialConfig
from loraplex.bench.serve.attack_hang import hung_engine
from loraplex.bench.serve.attack_kinds import (
    FANOUT,
    HALF_OPEN_FLOOD,
    HUNG_ENGINE,
    ISOLATED_KINDS,
    SEAT_HOG,
    STUCK_STREAM,
    TOKEN_ID_BATCH,
    Attack,
    KindPlan,
    KindTarget,
    Tally,
    fanout,
    seat_hog,
    token_ids,
)
from loraplex.bench.serve.attack_process import AttackProcess
from loraplex.bench.serve.attack_sockets import half_open_flood, stuck_streams
from loraplex.bench.serve.attacker import ATTACKER
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, ResidencyView, replay_over_http
from loraplex.bench.serve.fleet import Fleet, ServerOptions, serving_process
from loraplex.bench.workloads import Workload

ATTACKS: dict[str, Attack] = {
    SEAT_HOG: seat_hog,
    FANOUT: fanout,
    HALF_OPEN_FLOOD: half_open_flood,
    STUCK_STREAM: stuck_streams,
    TOKEN_ID_BATCH: token_ids,
    HUNG_ENGINE: hung_engine,
}


def attack_for(kind: str) -> Attack:
    """The implementation of ``kind``; ValueError naming the known kinds otherwise."""
    if kind not in ATTACKS:
        raise ValueError(f"attack kind {kind!r} is invalid; expected one of {ISOLATED_KINDS}")
    return ATTACKS[kind]


@dataclass(frozen=True)
class RunCpu:
    """CPU seconds over one run's trace (from when the server was ready to the trace's end).

    On one machine the benchmark's CPU is taken from the server's: ``attacker_s`` is what the
    attacker's own process cost the shared cores (it runs apart from the victims' client)."""

    server_s: float  # the server process tree (front and engine), user + system
    client_s: float  # this benchmark process: the victims' client only
    attacker_s: float | None = None  # the attack's own process, go to end; None: calm run


@dataclass(frozen=True)
class KindRun:
    """One server run of the victims' trace for one kind, with or without its attack."""

    kind: str  # the attack kind the run belongs to
    name: str  # "adversarial/<kind>/calm" or ".../attacked" (plus "-<round>" past one round)
    attacked: bool  # whether the attack ran alongside
    records: tuple[RequestRecord, ...]  # the victims' requests, in trace order
    residency: ResidencyView  # the server's cache, as for every other run
    rss_growth_bytes: int  # server tree RSS when the trace ended minus when the server was ready
    attacker: Tally  # what the attack got ({} when calm)
    cpu: RunCpu  # CPU seconds the run cost, server side and benchmark client side


@dataclass(frozen=True)
class PlannedKindRun:
    """One run of one kind's pair, before it runs."""

    kind: str  # the attack kind
    name: str  # the run's name
    attacked: bool  # whether the attack runs alongside


def kind_run_order(kinds: Sequence[str], rounds: int) -> list[PlannedKindRun]:
    """Every kind's (calm, attacked) pair per round, calm first when ``kind + round`` is even."""
    out = []
    for round_index in range(rounds):
        for kind_index, kind in enumerate(kinds):
            calm_first = (kind_index + round_index) % 2 == 0
            for attacked in (False, True) if calm_first else (True, False):
                label = "attacked" if attacked else "calm"
                suffix = f"-{round_index}" if rounds > 1 else ""
                out.append(PlannedKindRun(kind, f"{ADVERSARIAL}/{kind}/{label}{suffix}", attacked))
    return out


def run_attack_kinds(
    fleet: Fleet,
    root: Path,
    workload: Workload,
    *,
    options: ServerOptions,
    drive: DriveConfig,
    config: AdversarialConfig,
) -> list[KindRun]:
    """Every selected kind's pairs of runs (``config.isolated_kinds``, ``config.rounds``)."""
    plan = KindPlan(
        workload.duration_s,
        config.attack_rate,
        config.attack_max_in_flight,
        config.flood_sockets,
        config.hang_s,
        drive.request_timeout_s,
        drive.vocab_size,
        drive.seed,
    )
    runs = []
    for index, planned in enumerate(kind_run_order(config.isolated_kinds, config.rounds)):
        with serving_process(fleet, root / f"run-{index}", options) as served:
            target = KindTarget(served.url, fleet.keys[ATTACKER], served.pid)
            attack = attack_for(planned.kind) if planned.attacked else None
            victims = _Victims(workload, fleet.keys, fleet.admin_key, drive)
            both = _both(victims, target, plan, attack, config.attacker_priority)
            records, view, growth, tally, cpu = asyncio.run(both)
        runs.append(KindRun(planned.kind, planned.name, planned.attacked, tuple(records), view,
                            growth, tally, cpu))  # fmt: skip
    return runs


@dataclass(frozen=True)
class _Victims:
    """The victims' side of a run: their trace and how it is replayed."""

    workload: Workload  # the trace
    keys: dict[str, str]  # tenant -> API key
    admin_key: str  # for the residency polls
    drive: DriveConfig  # how it is replayed


async def _both(
    victims: _Victims, target: KindTarget, plan: KindPlan, attack: Attack | None, priority: str
) -> tuple[list[RequestRecord], ResidencyView, int, Tally, RunCpu]:
    """The victims' trace here, the attack (if any) in its own process (``attack_process``) at
    ``priority``."""
    call = None if attack is None else functools.partial(attack, target, plan)
    process = None if call is None else AttackProcess(call, priority)
    try:
        if process is not None:
            await asyncio.to_thread(process.start)  # its imports before any clock starts
        before = tree_rss_bytes(target.server_pid)
        server_cpu_s, client_cpu_s = tree_cpu_s(target.server_pid), time.process_time()
        if process is not None:
            process.go()
        records, view = await replay_over_http(
            target.url, victims.workload.requests, victims.keys, victims.admin_key, victims.drive
        )
        growth = tree_rss_bytes(target.server_pid) - before
        server_s = round(tree_cpu_s(target.server_pid) - server_cpu_s, 2)
        client_s = round(time.process_time() - client_cpu_s, 2)
        result = None if process is None else await asyncio.to_thread(process.finish)
    finally:
        if process is not None:  # on an error too: no attack outlives its run
            await asyncio.to_thread(process.close)
    tally = {} if result is None else result.tally
    cpu = RunCpu(server_s, client_s, None if result is None else result.cpu_s)
    return records, view, growth, tally, cpu
