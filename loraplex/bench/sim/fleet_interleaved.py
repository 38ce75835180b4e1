"""``bench sim --calibrate-fleet-interleaved K``: the fleet's lone terms measured as short passes
in the invocation's own Ray cluster, one right before each real fleet run and one after the
last, each fleet trace priced from the passes around its runs (docs/simulator.md, "FLEETCAL").

``sim calibrate-fleet`` measures the fleet once, before ``bench sim`` starts; in the
nineteenth session's quiet hold its lone requests took 17 ms to the first token where the
trace runs' warm requests took 20-22 ms four to nine minutes later (the host probe 1.22-1.37
times slower then). A pass here is ``calibrate-fleet``'s lone part on the fleet the traces run
on (the invocation's settings; the same Ray cluster): a fresh deployment, both lone adapters
warmed, then 1/K of its paced lone requests per prompt length and adapter (at least 2) and of
its decode requests, each of the fleetcal tenant's own adapters (never a trace's). A fleet
trace's ``fleet_cpu_scale``, ``network_s`` and ``network_jitter_s`` are fitted
(``sim/calibrate_fleet.fit_fleet``) on the merged samples of its adjacent passes over the
cost-model file's lone-server terms; the file's ``fleet_contention`` is kept (the rounds are
not repeated: a pass of them takes placement, warming and 12 rounds). Each pass ends with
``cold_requests`` lone cold requests (4 unless set; each on an adapter of its own; the fleet's
stage counters read around each); a trace's ``fleet_load_scale`` is fitted on its adjacent
passes' loads' stage seconds (``sim/calibrate_fleet.fit_load_scale``) and replaces the file's
(``sim calibrate-fleet``'s, on its own 12 by default): like the other lone terms, measured at
the runs' time; its source names the file's value it replaced. With 0 the file's value (or
none) prices the loads, its source kept; with fewer than ``MIN_STAGE_SAMPLES`` timed, too, its
source then saying how many the passes kept.
"""

from __future__ import annotations

import datetime
import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.serve.fleet import Fleet
from loraplex.bench.sim.calibrate_fleet import FleetCalibrateConfig, usable_cores
from loraplex.bench.sim.fleet_lone import (
    PASS_COLD_REQUESTS,
    check_cold_requests,
    cold_adapters,
    lone_adapters,
)
from loraplex.bench.sim.interleaved import adjacent_passes
from loraplex.bench.sim.validate import RealSettings
from loraplex.sim.calibrate_fleet import (
    FleetSample,
    LoadScaleFit,
    fit_fleet,
    fit_load_scale,
    fleet_model,
    stage_load_ratios,
    stage_timed,
    ttft_load_ratios,
)
from loraplex.sim.cost_model import CostModel
from loraplex.sim.host_speed import HostProbe, probe_ratio

MIN_LONE_REQUESTS = 2  # per prompt length and adapter, and decode ones per adapter, per pass


def fleet_pass_config(
    fraction: int, base: FleetCalibrateConfig | None = None
) -> FleetCalibrateConfig:
    """One pass's share of ``base``: 1/``fraction`` of its lone requests per prompt length and
    adapter and of its decode requests (at least ``MIN_LONE_REQUESTS``)."""
    if fraction < 1:
        raise ValueError(f"calibrate_fleet_interleaved {fraction} is invalid; expected >= 1")
    base = FleetCalibrateConfig() if base is None else base
    return replace(base, requests=max(MIN_LONE_REQUESTS, math.ceil(base.requests / fraction)))


@dataclass(frozen=True)
class FleetPass:
    """One pass: its lone samples, the requests left out, the host probes around it."""

    samples: tuple[FleetSample, ...]
    left_out: int  # failed or not served from a GPU slot
    probes: tuple[HostProbe, HostProbe]  # before its deployment and after it was deleted
    started: str  # UTC, ISO seconds


def fleet_terms(
    base: CostModel, samples: Sequence[FleetSample], cores: int, where: str
) -> CostModel:
    """``base`` with the fleet's lone terms fitted on ``samples`` (``fit_fleet``), the machine's
    ``cores`` and ``base``'s own ``fleet_contention``; refused without a curve in ``base``."""
    if base.fleet_contention is None:
        raise ValueError(
            "the cost model has no fleet_contention; expected a `sim calibrate-fleet` file "
            "(the passes measure the lone terms only)"
        )
    fit = fit_fleet(base, samples)
    cold = sum(s.cold for s in samples)
    sources = {
        "fleet_cpu_scale": f"median over {fit.decode_samples} lone warm paced decode requests "
        f"through the fleet of their TPOT over the base step's one-token price ({where})",
        "network_s": f"median over {fit.prefill_samples} lone warm paced requests through the "
        f"fleet of their TTFT less front_s, ipc_s and the scaled prefill step "
        f"({fit.raw_network_s * 1000:.2f} ms before the floor at 0; {where})",
        "network_jitter_s": "quantiles (every 5 %) of the same requests' TTFT less their "
        f"prompt length and adapter's median ({where})",
    }
    model = fleet_model(base, fit, cores, sources, base.fleet_contention)
    if not cold:
        return model
    timed = len(stage_timed(samples))
    try:
        load = fit_load_scale(model, samples)
    except ValueError as exc:  # too few timed: the file's value stays, and its source says so
        kept = model.sources.get("fleet_load_scale", "the file has no source for it")
        text = f"{kept}; not refitted by the fleet passes ({where}): {exc}"
        return replace(model, sources={**model.sources, "fleet_load_scale": text})
    replaced = base.fleet_load_scale
    text = (
        f"median over {timed} lone cold requests through the fleet (their adapter in no "
        f"replica; {cold - timed} more kept without stage seconds) of their load's stage "
        "seconds as the fleet's stage counters grew around each request, over the load's lone "
        f"price (sim/calibrate_fleet.fit_load_scale; {where}); "
        + ("the file had none" if replaced is None else f"replaces the file's {replaced:.4g}")
    )
    return replace(
        model, fleet_load_scale=load.scale, sources={**model.sources, "fleet_load_scale": text}
    )


def _own_load_scale(model: CostModel, samples: Sequence[FleetSample]) -> LoadScaleFit | None:
    """A pass's own load scale (``fit_load_scale``); None: too few timed cold requests."""
    try:
        return fit_load_scale(model, samples)
    except ValueError:
        return None


def mean_probe(probes: Sequence[HostProbe]) -> HostProbe:
    """The mean of ``probes`` per part."""
    return HostProbe(
        matmul_s=statistics.fmean(p.matmul_s for p in probes),
        loop_s=statistics.fmean(p.loop_s for p in probes),
    )


@dataclass
class InterleavedFleet:
    """Runs the passes (``run_pass``, called by ``bench.real`` in its Ray cluster before each
    fleet run and once after the last) and fits a trace's fleet terms from any set of them."""

    fraction: int  # K: each pass measures 1/K of calibrate-fleet's lone requests
    base: CostModel  # the cost-model file (its lone-server terms and fleet_contention)
    logs_dir: Path | None = None  # keeps each pass's samples
    cold_requests: int = PASS_COLD_REQUESTS  # each pass's lone cold requests; 0: none
    passes: list[FleetPass] = field(default_factory=list)  # in the order run
    cores: int = field(default_factory=usable_cores)  # where the fleet's processes run
    config: FleetCalibrateConfig = field(init=False)  # one pass's (``fleet_pass_config``)
    _registry: Fleet | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.config = fleet_pass_config(self.fraction)
        check_cold_requests(self.cold_requests, "cold_requests")
        if self.base.fleet_contention is None:
            raise ValueError(
                "calibrate_fleet_interleaved needs a cost model with fleet_contention "
                "(a `sim calibrate-fleet` file); the passes measure the lone terms only"
            )

    def run_pass(
        self, target: tuple[Fleet, str, int], settings: RealSettings, drive: DriveConfig, root: Path
    ) -> None:
        """One pass on a fresh deployment of ``settings`` in the caller's cluster (``target``:
        the invocation's registry, the ingress URL, its port; as ``validate.fleet_outcome``
        takes it), its own adapters registered under ``root`` on the first pass."""
        from loraplex.bench.fleet.cluster import deployed
        from loraplex.bench.serve.fleet import drop_page_cache, prepare_fleet
        from loraplex.bench.sim.calibrate_loads import stage_totals
        from loraplex.bench.sim.contention_rounds import evict_from_slots
        from loraplex.bench.sim.fleet_lone import cold_samples, warm_lone_samples
        from loraplex.bench.sim.host_probe import host_probe
        from loraplex.bench.sim.simulated import adapter_sizes
        from loraplex.bench.sim.validate import MAX_LORA_RANK, fleet_settings

        traces_registry, url, port = target
        adapters, colds = lone_adapters(), cold_adapters(self.cold_requests)
        if self._registry is None:
            model_dir = traces_registry.model_dir
            self._registry = prepare_fleet(
                root / "fleetcal-registry", model_dir, adapters + colds, MAX_LORA_RANK, drive.seed
            )
        registry = self._registry
        sizes, _ = adapter_sizes(registry.model_dir, adapters + colds)
        key = registry.keys[adapters[0].tenant]
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        before = host_probe()
        drop_page_cache(registry.store)
        where = root / f"fleetcal-p{len(self.passes)}"
        with deployed(fleet_settings(registry, settings, where, port), url, registry.admin_key):
            rng = random.Random(drive.seed)
            samples, left_out = warm_lone_samples(
                url, key, adapters, sizes, rng=rng, config=self.config, drive=drive
            )
            if colds:
                sized = [(a, sizes[(a.tenant, a.name)]) for a in colds]
                gap_s = self.config.hop_gap_s
                headers = {"Authorization": f"Bearer {registry.admin_key}"}
                with httpx.Client(base_url=url, headers=headers, timeout=30.0) as admin:
                    kept, lost = cold_samples(
                        url, key, sized, gap_s=gap_s, rng=rng, drive=drive,
                        evict=lambda adapter: evict_from_slots(admin, adapter),
                        stages=lambda: stage_totals(admin),
                    )  # fmt: skip
                samples += kept
                left_out += lost
        after = host_probe()
        one = FleetPass(tuple(samples), left_out, (before, after), started)
        if self.logs_dir is not None:
            body = {
                "started": started,
                "samples": [asdict(s) for s in samples],
                "left_out": left_out,
                "probes": [asdict(p) for p in one.probes],
            }
            text = json.dumps(body, sort_keys=True) + "\n"
            (self.logs_dir / f"fleet-calibration-p{len(self.passes)}.samples.json").write_text(
                text, encoding="utf-8"
            )
        self.passes.append(one)

    def model_of(self, indices: Sequence[int]) -> CostModel:
        """The base with the fleet terms fitted on the merged samples of passes ``indices``."""
        chosen = [self.passes[i] for i in indices]
        samples = [s for p in chosen for s in p.samples]
        where = (
            f"`loraplex bench sim --calibrate-fleet-interleaved {self.fraction}`, fleet passes "
            f"{list(indices)} of {len(self.passes)} (started {chosen[0].started}), "
            f"{sum(p.left_out for p in chosen)} requests left out"
        )
        return fleet_terms(self.base, samples, self.cores, where)

    def pass_report(self) -> list[dict[str, Any]]:
        """Each pass alone: its start, its fitted terms, its lone medians and its probes."""
        out = []
        for i, one in enumerate(self.passes):
            model = self.model_of([i])
            prefills = [s.ttft_s for s in one.samples if s.tpot_s is None and not s.cold]
            decodes = [s.tpot_s for s in one.samples if s.tpot_s is not None]
            colds = [s.ttft_s for s in one.samples if s.cold]
            own = _own_load_scale(model, one.samples)
            out.append(
                {
                    "started": one.started,
                    "fleet_cpu_scale": model.fleet_cpu_scale,
                    "network_s": model.network_s,
                    "lone_ttft_s_median": statistics.median(prefills) if prefills else None,
                    "decode_tpot_s_median": statistics.median(decodes) if decodes else None,
                    # the pass's own (None: it kept too few timed cold requests to fit one)
                    "fleet_load_scale": None if own is None else own.scale,
                    "cold_ratios": stage_load_ratios(model, one.samples),
                    "cold_ttft_ratios": ttft_load_ratios(model, one.samples),
                    "cold_ttft_s_median": statistics.median(colds) if colds else None,
                    "samples": len(one.samples),
                    "left_out": one.left_out,
                    "probe_total_s": [p.total_s for p in one.probes],
                }
            )
        return out


def fleet_pricing(
    calibration: InterleavedFleet, order: Sequence[str], run_probes: dict[str, list[HostProbe]]
) -> tuple[CostModel, dict[str, CostModel], dict[str, Any]]:
    """From the passes run around ``order``'s fleet runs (trace names in the order run): the
    model of all passes' merged samples, each trace's model from its adjacent passes
    (``interleaved.adjacent_passes``), and the report: the per-pass figures, which passes
    priced each trace, and per trace the median ratio of its runs' host probes over the mean
    of its passes' (slower host > 1)."""
    num = len(calibration.passes)
    if num != len(order) + 1:
        raise ValueError(
            f"{num} fleet passes for {len(order)} fleet runs; expected one before each run "
            "and one after the last"
        )
    whole = calibration.model_of(range(num))
    chosen = {
        name: adjacent_passes([i for i, run in enumerate(order) if run == name], num)
        for name in dict.fromkeys(order)
    }
    models = {name: calibration.model_of(passes) for name, passes in chosen.items()}
    ratios: dict[str, float | None] = {}
    for name, passes in chosen.items():
        runs = run_probes.get(name, [])
        around = mean_probe([p for i in passes for p in calibration.passes[i].probes])
        ratios[name] = (
            round(statistics.median(probe_ratio(p, around) for p in runs), 4) if runs else None
        )
    report = {
        "fraction": calibration.fraction,
        "requests_per_group": calibration.config.requests,
        "cold_requests_per_pass": calibration.cold_requests,
        "passes": calibration.pass_report(),
        "adjacent": chosen,
        "host_probe_ratio": ratios,
    }
    return whole, models, report
