"""``bench serve``'s adversarial scenario: can one hostile tenant hurt the others?

Two steady tenants (the victims: cold-storm's steady traffic, zipf over 16 adapters each) stream
the same trace twice in one invocation, on a fresh server each time: once alone ("calm") and
once while the attacker of ``serve_attacker`` works at a bounded rate ("attacked"). With more
than one round the order alternates (calm first in even rounds). Both runs are timed by the same
client clock around the same boundary (``serve_driver``), so the victims' P99 TTFT with the
attacker over without it says what the attacker cost them. Before each trace, the server's
keep-alive round trip is measured on its idle state: GET /v1/models on one reused connection.
This module runs the mixed attacker (the selected ones of its four kinds); issue 25's kinds each
run against a calm run of their own (``serve_attack_runs``, after these runs, on the same trace).
"""

from __future__ import annotations

import asyncio
import http.client
import statistics
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loraplex.bench.serve.attack_kinds import ISOLATED_KINDS
from loraplex.bench.serve.attack_process import PRIORITIES, AttackProcess
from loraplex.bench.serve.attacker import (
    ATTACKER,
    ATTACKER_ADAPTER,
    KINDS,
    AttackPlan,
    AttackRecord,
    MixedAttack,
    PathologicalAdapter,
)
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, ResidencyView, replay_over_http
from loraplex.bench.serve.fleet import Fleet, ServerOptions, serving
from loraplex.bench.workloads import (
    ATTENTION_TARGETS,
    ScenarioParams,
    TraceAdapter,
    TraceRequest,
    Workload,
    cold_storm,
)
from loraplex.residency.stats import percentile

ADVERSARIAL = "adversarial"
VICTIMS = ("steady-a", "steady-b")
KEEPALIVE_REQUESTS = 50  # timed GET /v1/models per server (after one that opens the connection)
# The mixed attacker's kinds (one attacked run cycling through those selected), then issue 25's
# kinds (each its own attacked run against its own calm run: serve_attack_runs).
ATTACK_KINDS = (*KINDS, *ISOLATED_KINDS)


@dataclass(frozen=True)
class AdversarialConfig:
    """The attacker's size (the victims' trace is the benchmark's, at its rate and length)."""

    attack_rate: float = 4.0  # attacker requests per second (its three uploads come on top)
    attack_max_in_flight: int = 4  # attacker requests open at once
    rounds: int = 1  # (calm, attacked) run pairs; the order alternates between rounds
    prompt_bytes: int = 8 << 20  # characters of each oversized prompt
    header_bytes: int = 100_000_000  # safetensors header of the huge-header adapter
    regex_depth: int = 20  # the regex adapter's backtracking: about 2**depth steps per module
    attack_kinds: tuple[str, ...] = ATTACK_KINDS  # which kinds run (a subset of ATTACK_KINDS)
    flood_sockets: int = 1100  # half-open-flood: unauthenticated sockets held open at once
    hang_s: float = 15.0  # hung-engine: seconds the engine process stays stopped
    # how the attack's own process competes for the cores (``attack_process.PRIORITIES``)
    attacker_priority: str = "normal"

    def __post_init__(self) -> None:
        for name in (
            "attack_rate",
            "attack_max_in_flight",
            "rounds",
            "prompt_bytes",
            "header_bytes",
            "regex_depth",
            "flood_sockets",
            "hang_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.attacker_priority not in PRIORITIES:
            raise ValueError(
                f"attacker_priority {self.attacker_priority!r} is invalid; expected one of "
                f"{PRIORITIES}"
            )
        unknown = [kind for kind in self.attack_kinds if kind not in ATTACK_KINDS]
        if not self.attack_kinds or unknown or len(set(self.attack_kinds)) < len(self.attack_kinds):
            raise ValueError(
                f"attack_kinds {self.attack_kinds} is invalid; expected distinct names from "
                f"{ATTACK_KINDS}"
            )

    @property
    def mixed_kinds(self) -> tuple[str, ...]:
        """The mixed attacker's selected kinds, in its cycle's order (none: no mixed run)."""
        return tuple(kind for kind in KINDS if kind in self.attack_kinds)

    @property
    def isolated_kinds(self) -> tuple[str, ...]:
        """Issue 25's selected kinds, in ISOLATED_KINDS' order."""
        return tuple(kind for kind in ISOLATED_KINDS if kind in self.attack_kinds)


@dataclass(frozen=True)
class AdversarialRun:
    """One server run of the victims' trace, with or without the attacker."""

    name: str  # "adversarial/calm" or "adversarial/attacked" (plus "-<round>" past one round)
    attacked: bool  # whether the attacker ran alongside
    records: tuple[RequestRecord, ...]  # the victims' requests, in trace order
    residency: ResidencyView  # the server's cache, as for every other run
    attacks: tuple[AttackRecord, ...]  # the attacker's requests and uploads (none when calm)
    keepalive_rtt_s: tuple[float, ...]  # GET /v1/models round trips on one reused connection


def adversarial_workload(seed: int, params: ScenarioParams) -> Workload:
    """cold-storm's two steady tenants without the storm, plus the attacker's ordinary adapter
    (so the shared registry holds it and the attacker gets a key)."""
    storm = cold_storm(seed, params)
    attacker = TraceAdapter(ATTACKER, ATTACKER_ADAPTER, 8, ATTENTION_TARGETS)
    adapters = (*(a for a in storm.adapters if a.tenant in VICTIMS), attacker)
    requests = tuple(r for r in storm.requests if r.tenant in VICTIMS)
    return Workload(ADVERSARIAL, seed, params.duration_s, adapters, requests)


@dataclass(frozen=True)
class _Shared:
    """What every run of the scenario shares."""

    fleet: Fleet  # the prepared registry and keys
    options: ServerOptions  # the server settings
    workload: Workload  # the victims' trace
    drive: DriveConfig  # how it is replayed
    hostile: tuple[PathologicalAdapter, ...]  # the attacker's adapters, written once
    attacker_priority: str  # how the attack's process competes for the cores


def run_adversarial(
    fleet: Fleet,
    root: Path,
    workload: Workload,
    *,
    options: ServerOptions,
    drive: DriveConfig,
    config: AdversarialConfig,
) -> list[AdversarialRun]:
    """Every (calm, attacked) pair of runs of the mixed attacker (its selected kinds), each on
    a fresh server with a cold cache."""
    hostile = _hostile_adapters(fleet, root, config) if "cold-adapter" in config.mixed_kinds else ()
    shared = _Shared(fleet, options, workload, drive, hostile, config.attacker_priority)
    runs: list[AdversarialRun] = []
    for planned in run_order(config.rounds):
        plan = AttackPlan(
            workload.duration_s,
            config.attack_rate,
            config.attack_max_in_flight,
            config.prompt_bytes,
            f"attack{planned.round_index}",
            drive.request_timeout_s,
            drive.vocab_size,
            drive.seed,
            config.mixed_kinds,
        )
        data_dir = root / f"run-{len(runs)}"
        runs.append(_run(shared, data_dir, planned.name, plan if planned.attacked else None))
    return runs


def _hostile_adapters(
    fleet: Fleet, root: Path, config: AdversarialConfig
) -> tuple[PathologicalAdapter, ...]:
    """The cold-adapter kind's adapters (its uploads are part of that kind)."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.serve.attack_adapters import write_pathological_adapters

    return write_pathological_adapters(
        BaseModelSpec.from_dir(fleet.model_dir),
        fleet.model_dir,
        root / "attack-files",
        header_bytes=config.header_bytes,
        regex_depth=config.regex_depth,
    )


@dataclass(frozen=True)
class PlannedRun:
    """One run of the scenario, before it runs."""

    name: str  # "adversarial/calm", "adversarial/attacked-1", ...
    attacked: bool  # whether the attacker runs alongside
    round_index: int  # which (calm, attacked) pair it belongs to


def run_order(rounds: int) -> list[PlannedRun]:
    """Calm then attacked in even rounds, the reverse in odd ones (WORKLOADS.md: alternate)."""
    out = []
    for round_index in range(rounds):
        for attacked in (False, True) if round_index % 2 == 0 else (True, False):
            label = "attacked" if attacked else "calm"
            suffix = f"-{round_index}" if rounds > 1 else ""
            out.append(PlannedRun(f"{ADVERSARIAL}/{label}{suffix}", attacked, round_index))
    return out


def _run(shared: _Shared, data_dir: Path, name: str, plan: AttackPlan | None) -> AdversarialRun:
    fleet, drive = shared.fleet, shared.drive
    with serving(fleet, data_dir, shared.options) as url:
        rtts = keepalive_rtts(url, fleet.keys[VICTIMS[0]], KEEPALIVE_REQUESTS)

        async def both() -> tuple[list[RequestRecord], ResidencyView, list[AttackRecord]]:
            def victims() -> Coroutine[Any, Any, tuple[list[RequestRecord], ResidencyView]]:
                requests = shared.workload.requests
                return replay_over_http(url, requests, fleet.keys, fleet.admin_key, drive)

            if plan is None:
                return (*await victims(), [])
            key = fleet.keys[ATTACKER]
            # Its own process (``attack_process``): its client work is not the victims' loop's.
            attack = MixedAttack(url, key, fleet.admin_key, shared.hostile, plan)
            process = AttackProcess(attack, shared.attacker_priority)
            try:
                await asyncio.to_thread(process.start)
                process.go()
                records, view = await victims()
                attacks = (await asyncio.to_thread(process.finish)).tally
            finally:
                await asyncio.to_thread(process.close)
            return records, view, attacks

        records, view, attacks = asyncio.run(both())
    return AdversarialRun(name, plan is not None, tuple(records), view, tuple(attacks), tuple(rtts))


def keepalive_rtts(url: str, key: str, count: int) -> list[float]:
    """Seconds per GET /v1/models on one keep-alive connection (the first, which opens it, is
    not counted). RuntimeError if the server closes the connection or refuses a request: the
    number would then not be a keep-alive round trip."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    headers = {"Authorization": f"Bearer {key}"}
    rtts = []
    try:
        for index in range(count + 1):
            began = time.perf_counter()
            connection.request("GET", "/v1/models", headers=headers)
            reply = connection.getresponse()
            reply.read()
            elapsed = time.perf_counter() - began
            if reply.status != 200 or reply.will_close:
                raise RuntimeError(
                    f"GET /v1/models answered {reply.status} (will_close={reply.will_close}); "
                    "expected 200 on a kept-alive connection"
                )
            if index:
                rtts.append(elapsed)
    finally:
        connection.close()
    return rtts


# --- metrics ---------------------------------------------------------------------------------


def victim_failed(record: RequestRecord, request: TraceRequest) -> bool:
    """An error status or event, a timeout, or a stream that ended short of its tokens (the
    trace asks for exactly ``output_tokens`` with ignore_eos: a cut stream is a failure)."""
    return not record.ok or record.completion_tokens < request.output_tokens


def _victims(
    runs: Sequence[AdversarialRun], workload: Workload, attacked: bool, timeout_s: float
) -> tuple[int, int, float]:
    """(requests, failed, P99 TTFT ms) over the victims' requests of the runs of one side; a
    failed request counts in the percentile as the request timeout."""
    ttfts: list[float] = []
    failed = 0
    for run in runs:
        if run.attacked != attacked:
            continue
        for record, request in zip(run.records, workload.requests, strict=True):
            bad = victim_failed(record, request)
            failed += bad
            ttfts.append(timeout_s if bad or record.ttft_s is None else record.ttft_s)
    return len(ttfts), failed, round(percentile(sorted(ttfts), 0.99) * 1000, 2)


def _statuses(records: Sequence[AttackRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        label = str(record.status) if record.error is None or record.status != 200 else "200-error"
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


def adversarial_metrics(
    runs: Sequence[AdversarialRun], workload: Workload, timeout_s: float
) -> dict[str, Any]:
    """The scenario's headline: victims' failed ratio and P99 TTFT ratio, keep-alive RTT, and
    what the attacker got (status counts; "200-error": an error event inside a 200 stream)."""
    requests, failed, p99 = _victims(runs, workload, True, timeout_s)
    _, calm_failed, calm_p99 = _victims(runs, workload, False, timeout_s)
    attacks = [a for run in runs for a in run.attacks]
    kinds = sorted({a.kind for a in attacks})
    rtts = [rtt for run in runs for rtt in run.keepalive_rtt_s]
    return {
        "adversarial_victim_failed_ratio": round(failed / requests, 4) if requests else None,
        "adversarial_victim_p99_ttft_ratio": round(p99 / calm_p99, 3) if calm_p99 > 0 else None,
        "keepalive_rtt_ms": round(statistics.median(rtts) * 1000, 3) if rtts else None,
        "adversarial_victim_requests": requests,
        "adversarial_victim_failed": failed,
        "adversarial_victim_failed_calm": calm_failed,
        "adversarial_victim_p99_ttft_ms_attacked": p99,
        "adversarial_victim_p99_ttft_ms_calm": calm_p99,
        "adversarial_attacker_requests": len(attacks),
        "adversarial_attacker_statuses": _statuses(attacks),
        "adversarial_attacker_by_kind": {
            kind: _statuses([a for a in attacks if a.kind == kind]) for kind in kinds
        },
    }
