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
``requests`` of ``output_tokens`` tokens (decode samples, their TPOT). Last, the contention
rounds (``contention_rounds.py``: for each of ``in_flight``, ``contention_rounds`` rounds of that
many clients sending back to back) on ``contention_adapters`` rank-8 adapters of their own, one
per replica unless set, placed one per replica by watching where each warmed candidate lands;
the report says where each went (``contention_where``) and where the simulator's replay put its
own (``contention_where_simulated``). After the rounds, ``cold_requests`` lone cold requests
(``fleet_lone.cold_samples``: 8 prompt tokens, one out, ``hop_gap_s`` apart, each on its own
adapter never requested before, so a load from the store; each evicted from the GPU slots after
its request, so every one meets the same free slots; the fleet's stage counters read around
each), whose loads' stage seconds over the lone server's load price fit ``fleet_load_scale``
(``sim/calibrate_fleet.fit_load_scale``; its source and the report's part:
``fleet_lone.with_load_scale``). None of it is a trace ``bench sim`` validates.
"""

from __future__ import annotations

import datetime
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.sim.calibrate_run import (
    HOP_GAP_S,
    HOP_OUTPUT_TOKENS,
    check_pacing,
)
from loraplex.bench.sim.contention_fit import fit_by_simulation
from loraplex.bench.sim.contention_rounds import (
    CONTENTION_PER_CLIENT,
    CONTENTION_PROMPT_TOKENS,
    FleetSlots,
    candidates,
    contention_samples,
    evict_from_slots,
    place,
    simulated_rounds,
)
from loraplex.bench.sim.fit_check import FLEET_RULES, BrokenFit, check_text, fleet_fit_faults
from loraplex.bench.sim.fleet_lone import (
    COLD_REQUESTS,
    TENANT,
    check_cold_requests,
    cold_adapters,
    cold_samples,
    lone_adapters,
    warm_lone_samples,
    warm_up,
    with_load_scale,
)
from loraplex.bench.sim.validate import MAX_LORA_RANK, RealSettings
from loraplex.bench.workloads import TraceAdapter
from loraplex.sim.calibrate_fleet import (
    ContentionSample,
    FleetSample,
    fit_contention,
    fit_fleet,
    fleet_model,
    round_medians,
    round_ttfts,
)
from loraplex.sim.cost_model import CostModel
from loraplex.sim.host_speed import HostProbe


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
    cold_requests: int = COLD_REQUESTS  # lone cold requests (fleet_load_scale); 0: none
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
        check_cold_requests(self.cold_requests, "cold_requests")

    @property
    def num_contention_adapters(self) -> int:
        return self.replicas if self.contention_adapters is None else self.contention_adapters


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), as the fleet's processes do."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _measure(
    url: str, key: str, adapters: Sequence[TraceAdapter], *,
    sizes: dict[tuple[str, str], int], config: FleetCalibrateConfig, drive: DriveConfig,
    rounds_pool: Sequence[TraceAdapter] = (),
    residency: Callable[[], list[int]] | None = None,
    evict: Callable[[TraceAdapter], None] | None = None,
    colds: Sequence[TraceAdapter] = (),
    stages: Callable[[], Mapping[str, float]] | None = None,
) -> tuple[list[FleetSample], list[ContentionSample], int, dict[str, Any]]:  # fmt: skip
    """The lone samples (the cold ones last), the contention rounds, the lone warm requests
    that failed or were not served warm (left out; a cold request left out is one of ``colds``
    without a sample), and where the rounds ran. The rounds' adapters are placed from
    ``rounds_pool`` one per replica (``contention_rounds.place``, watching each replica's
    GPU-slot count, ``residency``, and evicting the candidates not kept); without a pool or
    ``residency`` they are ``adapters``. After the rounds, one lone cold request on each of
    ``colds`` (``fleet_lone.cold_samples``, each evicted from the GPU slots after its request
    where ``evict`` is given; each load's stage seconds where ``stages`` reads the fleet's stage
    counters): after the rounds, so their loads never fill the slots whose growth places the
    rounds' adapters."""
    rng = random.Random(config.seed)
    samples, left_out = warm_lone_samples(
        url, key, adapters, sizes, rng=rng, config=config, drive=drive
    )
    contended = list(adapters)
    where: dict[str, Any] = {"adapters": [a.name for a in contended], "placed_on": None}
    if rounds_pool and residency is not None and evict is not None:
        slots = FleetSlots(lambda a: warm_up(url, key, a, rng=rng, drive=drive), residency, evict)
        wanted = config.num_contention_adapters
        placed = place(rounds_pool, wanted, config.replicas, slots.land, slots.drop)
        contended = placed.adapters or list(rounds_pool[:wanted])  # none seen: as before SPREAD2
        where = {
            "adapters": [a.name for a in contended],
            "placed_on": placed.replicas,
            "skipped": placed.skipped,
            "per_replica": placed.counts(config.replicas),
        }
    where["replica_l0_counts"] = None if residency is None else residency()
    rounds = contention_samples(
        url, key, contended, in_flight=config.in_flight, rounds=config.contention_rounds,
        gap_s=config.hop_gap_s, seed=config.seed, drive=drive,
    )  # fmt: skip
    if colds:
        sized = [(a, sizes[(a.tenant, a.name)]) for a in colds]
        kept, _ = cold_samples(
            url, key, sized, gap_s=config.hop_gap_s, rng=rng, drive=drive, evict=evict,
            stages=stages,
        )  # fmt: skip
        samples += kept
    return samples, rounds, left_out, where


def measure_fleet(
    config: FleetCalibrateConfig, asset_dir: Path
) -> tuple[list[FleetSample], list[ContentionSample], int, dict[str, Any], list[HostProbe]]:
    """Lone warm requests through a fresh local demo fleet (module docstring), and the host
    probe timed in its Ray cluster before the deployment and after its deletion (what
    ``bench sim``'s fleet runs' probes compare with)."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.fleet.cluster import deployed, fleet_state, local_cluster
    from loraplex.bench.serve.fleet import drop_page_cache, prepare_fleet
    from loraplex.bench.sim.calibrate_loads import stage_totals
    from loraplex.bench.sim.host_probe import host_probe
    from loraplex.bench.sim.simulated import adapter_sizes
    from loraplex.bench.sim.validate import fleet_settings
    from loraplex.demo.assets import generate_demo_assets
    from loraplex.fleet.board import PUSH_INTERVAL_S

    assets = generate_demo_assets(asset_dir / "test-small", preset="small", seed=0)
    model_dir = assets.base_model_dir
    vocab = BaseModelSpec.from_dir(model_dir).vocab_size
    adapters = lone_adapters()
    pool = candidates(TENANT, config.num_contention_adapters)
    colds = cold_adapters(config.cold_requests)
    sizes, _ = adapter_sizes(model_dir, [*adapters, *colds])
    settings = RealSettings(replicas=config.replicas, request_timeout_s=config.request_timeout_s)
    drive = DriveConfig(
        request_timeout_s=config.request_timeout_s, vocab_size=vocab, seed=config.seed
    )
    with tempfile.TemporaryDirectory(prefix="loraplex-sim-fleetcal-") as tmp:
        root = Path(tmp)
        registry = prepare_fleet(
            root / "registry", model_dir, [*adapters, *pool, *colds], MAX_LORA_RANK, config.seed
        )
        with local_cluster(1) as port:
            url = f"http://127.0.0.1:{port}"
            fleet = fleet_settings(registry, settings, root / "fleet", port)
            drop_page_cache(registry.store)

            def residency() -> list[int]:
                time.sleep(2 * PUSH_INTERVAL_S)  # every replica's status after the last change
                state = fleet_state(url, registry.admin_key)
                return [r["tiers"]["l0"]["count"] for r in state["replicas"]]

            headers = {"Authorization": f"Bearer {registry.admin_key}"}
            before = host_probe()
            with (
                deployed(fleet, url, registry.admin_key),
                httpx.Client(base_url=url, headers=headers, timeout=30.0) as admin,
            ):
                measured = _measure(
                    url, registry.keys[TENANT], adapters, sizes=sizes, config=config, drive=drive,
                    rounds_pool=pool, residency=residency,
                    evict=lambda adapter: evict_from_slots(admin, adapter), colds=colds,
                    stages=lambda: stage_totals(admin),
                )  # fmt: skip
            after = host_probe()
    return (*measured, [before, after])


def checked_measurements(
    base: CostModel, config: FleetCalibrateConfig, asset_dir: Path
) -> tuple[tuple[Any, ...], list[list[str]]]:
    """``measure_fleet``'s measurements, and the faults of each fit (``fit_check``): a fit that
    does not hold together has the fleet measured once more (a fresh fleet), that one kept."""
    measured = measure_fleet(config, asset_dir)
    checks = [fleet_fit_faults(fit_fleet(base, measured[0]))]
    if checks[0]:
        measured = measure_fleet(config, asset_dir)
        checks.append(fleet_fit_faults(fit_fleet(base, measured[0])))
    return measured, checks


def calibrate_fleet(
    base: CostModel,
    config: FleetCalibrateConfig,
    asset_dir: Path,
    command: str,
    *,
    accept_broken_fit: bool = False,
) -> tuple[CostModel, dict[str, Any]]:
    """``base`` with the fleet's terms measured on a local demo fleet, and the samples. A fit
    that fails twice (``checked_measurements``) raises ``BrokenFit`` unless
    ``accept_broken_fit``; the checks are in ``sources.fleet_fit_check`` and the report."""
    measured, checks = checked_measurements(base, config, asset_dir)
    samples, rounds, left_out, rounds_where, probes = measured
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
        f"on adapter i mod {len(rounds_where['adapters'])} (rank 8, placed one per replica "
        f"unless set: bench/sim/contention_rounds.place, per replica "
        f"{rounds_where.get('per_replica')}) "
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
    first_model, cold_report = with_load_scale(first_model, samples, config.cold_requests, where)
    sim_config, shape, sim_placed = simulated_rounds(
        base, asset_dir, replicas=config.replicas, wanted=config.num_contention_adapters,
        tenant=TENANT, request_timeout_s=config.request_timeout_s,
    )  # fmt: skip
    fitted = fit_by_simulation(first_model, sim_config, shape, round_medians(rounds), first)
    model = replace(first_model, fleet_contention=fitted.contention)
    report = {
        "samples": [asdict(s) for s in samples],
        "left_out": left_out,
        "cold": cold_report,
        "contention": [asdict(r) for r in rounds],
        "contention_where": rounds_where,
        "contention_where_simulated": {
            "adapters": [a.name for a in sim_placed.adapters],
            "placed_on": sim_placed.replicas,
            "skipped": sim_placed.skipped,
        },
        "contention_first_pass": list(first.stretch),
        "contention_fit": {
            "iterations": fitted.iterations,
            "measured": fitted.measured,
            "simulated_first_pass": fitted.simulated_first,
            "simulated_fitted": fitted.simulated_fitted,
            "worst_gap": fitted.worst_gap,
            "ttft_s_measured": round_ttfts(rounds),
            "ttft_s_simulated": fitted.simulated_ttft_s,
        },
        "contention_raw_stretch": list(raw),
        "fit": asdict(fit),
        "host_probes": [asdict(p) for p in probes],
        "cores": cores,
        "machine": machine,
        "config": asdict(config),
    }
    text = "the fleet's fit " + check_text(checks, accept_broken_fit, FLEET_RULES, "the fleet")
    model = replace(model, sources={**model.sources, "fleet_fit_check": text})
    report["fit_check"] = {"measurements": checks, "accepted": accept_broken_fit, "text": text}
    if checks[-1] and not accept_broken_fit:
        raise BrokenFit(checks[-1], report, "fleet")
    return model, report
