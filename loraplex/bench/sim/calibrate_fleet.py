"""``loraplex sim calibrate-fleet``'s measurements: lone warm requests through a local demo
fleet's ingress (``bench fleet``'s Ray cluster, ``bench sim``'s fleet settings), and the fleet's
throughput with a few requests in flight, fitted by ``sim/calibrate_fleet.py`` onto a lone
server's cost model.

Two adapters (rank 8 and the largest served rank, attention targets) are registered for one
tenant; each is warmed (requests until one reports it in a GPU slot, so the router's affinity
sends the rest to that replica), then, one request at a time so nothing queues, paced as the
lone server's calibration paces its lone requests (``calibrate_run.paced_requests``: as
``bench sim``'s real fleet runs send a trace, ``hop_gap_s`` apart): ``requests`` lone requests
of ``hop_output_tokens`` tokens per prompt length (prefill samples, their TTFT), and
``requests`` of ``output_tokens`` tokens (decode samples, their TPOT). Last, for each of
``in_flight`` (1, 2, 4, 8): ``contention_rounds`` rounds of that many clients, each sending
``CONTENTION_PER_CLIENT`` requests back to back (a closed loop: the count in flight stays put),
the round's completed requests over its wall time. The rounds' requests go to
``contention_adapters`` rank-8 adapters of their own (one per replica unless set), each warmed
first, client ``i`` on adapter ``i mod n``, so the router can spread the rounds over every
replica as a trace's tail spreads (before, the rounds used the two lone adapters, so at most two
replicas took them); how many adapters each replica then held in a GPU slot is in the report.
None of it is a trace ``bench sim`` validates.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loraplex.bench.fleet.drive import replay
from loraplex.bench.harness.machine import machine_record
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, prompt_ids, send_one
from loraplex.bench.sim.calibrate_run import (
    HOP_GAP_S,
    HOP_OUTPUT_TOKENS,
    check_pacing,
    paced_requests,
)
from loraplex.bench.sim.contention_fit import RoundShape, fit_by_simulation
from loraplex.bench.sim.validate import MAX_LORA_RANK, RealSettings
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter, TraceRequest
from loraplex.sim.calibrate_fleet import (
    ContentionSample,
    FleetSample,
    fit_contention,
    fit_fleet,
    fleet_model,
    round_medians,
)
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel

TENANT = "fleetcal"
WARM_TRIES = 6  # requests per adapter until one is served from a GPU slot
CONTENTION_PER_CLIENT = 4  # requests each client of a contention round sends back to back
CONTENTION_PROMPT_TOKENS = 16  # the prompt of every contention request (bench sim's traces')


@dataclass(frozen=True)
class FleetCalibrateConfig:
    """What one fleet calibration measures."""

    replicas: int = 3  # engine replicas (bench sim's fleet)
    requests: int = 8  # lone requests per prompt length and adapter, and decode ones per adapter
    prefill_lengths: tuple[int, ...] = (8, 16, 32, 64)
    output_tokens: int = 24  # tokens of each decode request
    hop_gap_s: float = HOP_GAP_S  # idle seconds before each lone request (and each round)
    hop_output_tokens: int = HOP_OUTPUT_TOKENS  # tokens of each lone prefill request
    in_flight: tuple[int, ...] = (1, 2, 4, 8)  # requests in flight of the contention rounds
    contention_rounds: int = 3  # rounds per in-flight count (their median throughput)
    contention_adapters: int | None = None  # adapters of the rounds; None: one per replica
    request_timeout_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_pacing(self.hop_gap_s, self.hop_output_tokens)
        counts = self.in_flight
        if 1 not in counts or len(set(counts)) < 2 or min(counts) < 1 or max(counts) > 64:
            raise ValueError(f"in_flight {counts} is invalid; expected 1 and other counts in 1..64")
        if self.contention_rounds < 1:
            raise ValueError(
                f"contention_rounds {self.contention_rounds} is invalid; expected >= 1"
            )
        if self.contention_adapters is not None and not 1 <= self.contention_adapters <= 64:
            raise ValueError(
                f"contention_adapters {self.contention_adapters} is invalid; expected 1 to 64"
            )
        if self.replicas < 2:
            raise ValueError(f"replicas {self.replicas} is invalid; expected >= 2 (a fleet)")
        if self.requests < 2:
            raise ValueError(f"requests {self.requests} is invalid; expected >= 2")
        if not self.prefill_lengths or min(self.prefill_lengths) < 1:
            raise ValueError(f"prefill_lengths {self.prefill_lengths} is invalid; expected >= 1")
        if self.output_tokens < 3:
            raise ValueError(f"output_tokens {self.output_tokens} is invalid; expected >= 3")

    @property
    def num_contention_adapters(self) -> int:
        return self.replicas if self.contention_adapters is None else self.contention_adapters


def contention_adapters(config: FleetCalibrateConfig) -> list[TraceAdapter]:
    """The rounds' own adapters: rank 8, attention targets, one tenant with the lone ones."""
    return [
        TraceAdapter(TENANT, f"c{i}", 8, ATTENTION_TARGETS)
        for i in range(config.num_contention_adapters)
    ]


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), as the fleet's processes do."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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
    config: FleetCalibrateConfig, drive: DriveConfig,
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


def _lone_samples(
    url: str, key: str, adapter: TraceAdapter, nbytes: int, *,
    config: FleetCalibrateConfig, drive: DriveConfig,
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


async def _round(
    url: str, key: str, adapters: Sequence[TraceAdapter], clients: int, *,
    rng: random.Random, drive: DriveConfig,
) -> float:  # fmt: skip
    """Completed requests per second of ``clients`` clients sending back to back."""
    length, tokens = CONTENTION_PROMPT_TOKENS, HOP_OUTPUT_TOKENS

    async def client(index: int) -> int:
        adapter = adapters[index % len(adapters)]
        request = TraceRequest(0.0, adapter.tenant, adapter.name, length, tokens)
        done = 0
        for _ in range(CONTENTION_PER_CLIENT):
            ids = prompt_ids(rng, length, drive.vocab_size)
            record = await send_one(
                url, request, key=key, ids=ids, arrival=time.monotonic(), tier="L3", config=drive
            )
            done += record.ok
        return done

    start = time.monotonic()
    done = sum(await asyncio.gather(*(client(i) for i in range(clients))))
    return done / (time.monotonic() - start)


def _contention_samples(
    url: str, key: str, adapters: Sequence[TraceAdapter], *, config: FleetCalibrateConfig,
    drive: DriveConfig,
) -> list[ContentionSample]:  # fmt: skip
    """``contention_rounds`` rounds per in-flight count, each after ``hop_gap_s`` idle; a round
    with nothing completed makes no sample."""
    rng = random.Random(config.seed + 13)
    samples = []
    for clients in sorted(set(config.in_flight)):
        for _ in range(config.contention_rounds):
            time.sleep(config.hop_gap_s)
            rate = asyncio.run(_round(url, key, adapters, clients, rng=rng, drive=drive))
            if rate > 0:
                samples.append(ContentionSample(clients, rate))
    return samples


def _warm_up(
    url: str, key: str, adapter: TraceAdapter, *, rng: random.Random, drive: DriveConfig
) -> bool:
    """Requests until one is served from a GPU slot (at most ``WARM_TRIES``); False: none was."""
    for _ in range(WARM_TRIES):
        if asyncio.run(_lone(url, key, adapter, length=8, rng=rng, drive=drive)) == "L0":
            return True
    return False


def _measure(
    url: str, key: str, adapters: Sequence[TraceAdapter], *,
    sizes: dict[tuple[str, str], int], config: FleetCalibrateConfig, drive: DriveConfig,
    rounds_adapters: Sequence[TraceAdapter] = (),
    residency: Callable[[], list[int]] | None = None,
) -> tuple[list[FleetSample], list[ContentionSample], int, dict[str, Any]]:  # fmt: skip
    """The lone samples, the contention rounds (on ``rounds_adapters``, each warmed first;
    ``adapters`` when empty), the lone requests that failed or were not served warm (left
    out), and where the rounds ran: how many of their adapters were warmed, and each replica's
    GPU-slot count before the rounds (``residency``, when given)."""
    rng = random.Random(config.seed)
    samples: list[FleetSample] = []
    left_out = 0
    for adapter in adapters:
        _warm_up(url, key, adapter, rng=rng, drive=drive)
        nbytes = sizes[(adapter.tenant, adapter.name)]
        kept, lost = _lone_samples(url, key, adapter, nbytes, config=config, drive=drive)
        samples += kept
        left_out += lost
    contended = list(rounds_adapters) or list(adapters)
    warmed = sum(_warm_up(url, key, a, rng=rng, drive=drive) for a in rounds_adapters)
    where: dict[str, Any] = {
        "adapters": [a.name for a in contended],
        "warmed": warmed if rounds_adapters else None,
        "replica_l0_counts": None if residency is None else residency(),
    }
    rounds = _contention_samples(url, key, contended, config=config, drive=drive)
    return samples, rounds, left_out, where


def measure_fleet(
    config: FleetCalibrateConfig, asset_dir: Path
) -> tuple[list[FleetSample], list[ContentionSample], int, dict[str, Any]]:
    """Lone warm requests through a fresh local demo fleet (module docstring)."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.fleet.cluster import deployed, fleet_state, local_cluster
    from loraplex.bench.serve.fleet import drop_page_cache, prepare_fleet
    from loraplex.bench.sim.bench import adapter_sizes
    from loraplex.bench.sim.validate import fleet_settings
    from loraplex.demo.assets import generate_demo_assets
    from loraplex.fleet.board import PUSH_INTERVAL_S

    assets = generate_demo_assets(asset_dir / "test-small", preset="small", seed=0)
    model_dir = assets.base_model_dir
    vocab = BaseModelSpec.from_dir(model_dir).vocab_size
    adapters = [
        TraceAdapter(TENANT, f"r{rank}", rank, ATTENTION_TARGETS) for rank in (8, MAX_LORA_RANK)
    ]
    rounds_adapters = contention_adapters(config)
    sizes, _ = adapter_sizes(model_dir, adapters)
    settings = RealSettings(replicas=config.replicas, request_timeout_s=config.request_timeout_s)
    drive = DriveConfig(
        request_timeout_s=config.request_timeout_s, vocab_size=vocab, seed=config.seed
    )
    with tempfile.TemporaryDirectory(prefix="loraplex-sim-fleetcal-") as tmp:
        root = Path(tmp)
        registry = prepare_fleet(
            root / "registry", model_dir, [*adapters, *rounds_adapters], MAX_LORA_RANK, config.seed
        )
        with local_cluster(1) as port:
            url = f"http://127.0.0.1:{port}"
            fleet = fleet_settings(registry, settings, root / "fleet", port)
            drop_page_cache(registry.store)

            def residency() -> list[int]:
                time.sleep(2 * PUSH_INTERVAL_S)  # every replica's status after the warming
                state = fleet_state(url, registry.admin_key)
                return [r["tiers"]["l0"]["count"] for r in state["replicas"]]

            with deployed(fleet, url, registry.admin_key):
                return _measure(
                    url, registry.keys[TENANT], adapters, sizes=sizes, config=config, drive=drive,
                    rounds_adapters=rounds_adapters, residency=residency,
                )  # fmt: skip


def rounds_in_simulator(
    config: FleetCalibrateConfig, asset_dir: Path
) -> tuple[SimConfig, RoundShape]:
    """The fleet ``bench sim`` simulates (this calibration's replicas) and what a contention
    round sends, for the fit by simulation."""
    from loraplex.bench.sim.bench import SimBenchConfig, adapter_sizes, sim_config
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(asset_dir / "test-small", preset="small", seed=0)
    adapters = contention_adapters(config)
    sizes, per_rank = adapter_sizes(assets.base_model_dir, adapters)
    settings = RealSettings(replicas=config.replicas, request_timeout_s=config.request_timeout_s)
    fields = sim_config(SimBenchConfig(settings=settings), "fleet", per_rank, {})
    shape = RoundShape(
        tuple((a.tenant, a.name, a.rank, sizes[(a.tenant, a.name)]) for a in adapters),
        CONTENTION_PER_CLIENT, CONTENTION_PROMPT_TOKENS, HOP_OUTPUT_TOKENS,
    )  # fmt: skip
    return SimConfig(**fields), shape


def calibrate_fleet(
    base: CostModel, config: FleetCalibrateConfig, asset_dir: Path, command: str
) -> tuple[CostModel, dict[str, Any]]:
    """``base`` with the fleet's terms measured on a local demo fleet, and the samples."""
    samples, rounds, left_out, rounds_where = measure_fleet(config, asset_dir)
    fit = fit_fleet(base, samples)
    first, raw = fit_contention(rounds)
    cores = usable_cores()
    machine = machine_record()
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    where = (
        f"`{command}` on {when}, {config.replicas} demo replicas on a local Ray cluster, "
        f"host {platform.node() or 'unknown'}, load {machine['load_1m']} at the end; "
        f"{left_out} requests left out (failed or not served from a GPU slot)"
    )
    sources = {
        "fleet_cpu_scale": f"median over {fit.decode_samples} lone warm paced decode requests "
        f"through the fleet of their TPOT over the base step's one-token price ({where})",
        "network_s": f"median over {fit.prefill_samples} lone warm requests through the fleet, "
        f"paced {config.hop_gap_s} s apart, {config.hop_output_tokens} tokens each, "
        f"of their TTFT less front_s, ipc_s and the scaled prefill step "
        f"({fit.raw_network_s * 1000:.2f} ms before the floor at 0; {where})",
        "fleet_contention": f"slowdown per request with k requests in flight through the "
        f"fleet: k x X(1) / X(k), X the median over {config.contention_rounds} rounds of k "
        f"clients each sending {CONTENTION_PER_CLIENT} warm requests back to back, client i "
        f"on adapter i mod {len(rounds_where['adapters'])} (rank 8, one per replica unless set) "
        f"({CONTENTION_PROMPT_TOKENS} prompt, {HOP_OUTPUT_TOKENS} output tokens) of completed "
        f"requests per second; floored at 1 (raw {[round(r, 3) for r in raw]}; {where}); "
        f"then fitted by simulation: each point rescaled until the simulator replaying the rounds "
        f"reproduces X(k) / X(1) (bench/sim/contention_fit.py; first pass and fit in the report)",
        "network_jitter_s": "quantiles (every 5 %) of the same requests' TTFT less their "
        "prompt length and adapter's median; a fleet's hop draws from them",
        "cores": f"the CPU cores the calibrating process may run on (sched_getaffinity), where "
        f"the fleet's processes ran ({where})",
    }
    first_model = fleet_model(base, fit, cores, sources, first)
    sim_config, shape = rounds_in_simulator(config, asset_dir)
    fitted = fit_by_simulation(first_model, sim_config, shape, round_medians(rounds), first)
    model = replace(first_model, fleet_contention=fitted.contention)
    report = {
        "samples": [asdict(s) for s in samples],
        "left_out": left_out,
        "contention": [asdict(r) for r in rounds],
        "contention_where": rounds_where,
        "contention_first_pass": list(first.stretch),
        "contention_fit": {
            "iterations": fitted.iterations,
            "measured": fitted.measured,
            "simulated_first_pass": fitted.simulated_first,
            "simulated_fitted": fitted.simulated_fitted,
            "worst_gap": fitted.worst_gap,
        },
        "contention_raw_stretch": list(raw),
        "fit": asdict(fit),
        "cores": cores,
        "machine": machine,
        "config": asdict(config),
    }
    return model, report
