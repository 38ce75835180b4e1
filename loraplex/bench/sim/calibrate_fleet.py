"""``loraplex sim calibrate-fleet``'s measurements: lone warm requests through a local demo
fleet's ingress (``bench fleet``'s Ray cluster, ``bench sim``'s fleet settings), fitted by
``sim/calibrate_fleet.py`` onto a lone server's cost model.

Two adapters (rank 8 and the largest served rank, attention targets) are registered for one
tenant; each is warmed (requests until one reports it in a GPU slot, so the router's affinity
sends the rest to that replica), then, one request at a time so nothing queues: ``requests``
lone requests of ``max_tokens`` 1 per prompt length (prefill samples), and ``requests`` of
``output_tokens`` tokens (decode samples, their TPOT). None of it is a trace ``bench sim``
validates.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.serve.driver import DriveConfig, prompt_ids, send_one
from loraplex.bench.sim.validate import MAX_LORA_RANK, RealSettings
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter, TraceRequest
from loraplex.sim.calibrate_fleet import FleetSample, fit_fleet, fleet_model
from loraplex.sim.cost_model import CostModel

TENANT = "fleetcal"
WARM_TRIES = 6  # requests per adapter until one is served from a GPU slot


@dataclass(frozen=True)
class FleetCalibrateConfig:
    """What one fleet calibration measures."""

    replicas: int = 3  # engine replicas (bench sim's fleet)
    requests: int = 8  # lone requests per prompt length and adapter, and decode ones per adapter
    prefill_lengths: tuple[int, ...] = (8, 16, 32, 64)
    output_tokens: int = 24  # tokens of each decode request
    request_timeout_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 2:
            raise ValueError(f"replicas {self.replicas} is invalid; expected >= 2 (a fleet)")
        if self.requests < 2:
            raise ValueError(f"requests {self.requests} is invalid; expected >= 2")
        if not self.prefill_lengths or min(self.prefill_lengths) < 1:
            raise ValueError(f"prefill_lengths {self.prefill_lengths} is invalid; expected >= 1")
        if self.output_tokens < 3:
            raise ValueError(f"output_tokens {self.output_tokens} is invalid; expected >= 3")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), as the fleet's processes do."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


async def _lone(
    url: str, key: str, adapter: TraceAdapter, *, length: int, tokens: int,
    rng: random.Random, drive: DriveConfig,
) -> tuple[float | None, float | None, str]:  # fmt: skip
    request = TraceRequest(0.0, adapter.tenant, adapter.name, length, tokens)
    record = await send_one(
        url,
        request,
        key=key,
        ids=prompt_ids(rng, length, drive.vocab_size),
        arrival=time.monotonic(),
        tier="L3",
        config=drive,
    )
    ok = record.ok and record.ttft_s is not None
    return (record.ttft_s if ok else None), (record.tpot_s if ok else None), record.tier


def _measure(
    url: str, key: str, adapters: Sequence[TraceAdapter], *,
    sizes: dict[tuple[str, str], int], config: FleetCalibrateConfig, drive: DriveConfig,
) -> tuple[list[FleetSample], int]:  # fmt: skip
    """The samples, and the requests that failed or were not served warm (left out)."""
    rng = random.Random(config.seed)
    samples: list[FleetSample] = []
    left_out = 0
    for adapter in adapters:
        rank, nbytes = min(adapter.rank, MAX_LORA_RANK), sizes[(adapter.tenant, adapter.name)]
        for _ in range(WARM_TRIES):
            _, _, tier = asyncio.run(
                _lone(url, key, adapter, length=8, tokens=1, rng=rng, drive=drive)
            )
            if tier == "L0":
                break
        for length in config.prefill_lengths:
            for _ in range(config.requests):
                ttft, _, tier = asyncio.run(
                    _lone(url, key, adapter, length=length, tokens=1, rng=rng, drive=drive)
                )
                if ttft is None or tier != "L0":
                    left_out += 1
                    continue
                samples.append(FleetSample(length, rank, nbytes, ttft))
        for _ in range(config.requests):
            ttft, tpot, tier = asyncio.run(
                _lone(
                    url, key, adapter, length=8, tokens=config.output_tokens, rng=rng, drive=drive
                )
            )
            if ttft is None or tpot is None or tier != "L0":
                left_out += 1
                continue
            samples.append(FleetSample(8, rank, nbytes, ttft, tpot))
    return samples, left_out


def measure_fleet(config: FleetCalibrateConfig, asset_dir: Path) -> tuple[list[FleetSample], int]:
    """Lone warm requests through a fresh local demo fleet (module docstring)."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.fleet.cluster import deployed, local_cluster
    from loraplex.bench.serve.fleet import drop_page_cache, prepare_fleet
    from loraplex.bench.sim.bench import adapter_sizes
    from loraplex.bench.sim.validate import fleet_settings
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(asset_dir / "test-small", preset="small", seed=0)
    model_dir = assets.base_model_dir
    vocab = BaseModelSpec.from_dir(model_dir).vocab_size
    adapters = [
        TraceAdapter(TENANT, f"r{rank}", rank, ATTENTION_TARGETS) for rank in (8, MAX_LORA_RANK)
    ]
    sizes, _ = adapter_sizes(model_dir, adapters)
    settings = RealSettings(replicas=config.replicas, request_timeout_s=config.request_timeout_s)
    drive = DriveConfig(
        request_timeout_s=config.request_timeout_s, vocab_size=vocab, seed=config.seed
    )
    with tempfile.TemporaryDirectory(prefix="loraplex-sim-fleetcal-") as tmp:
        root = Path(tmp)
        registry = prepare_fleet(root / "registry", model_dir, adapters, MAX_LORA_RANK, config.seed)
        with local_cluster(1) as port:
            url = f"http://127.0.0.1:{port}"
            fleet = fleet_settings(registry, settings, root / "fleet", port)
            drop_page_cache(registry.store)
            with deployed(fleet, url, registry.admin_key):
                return _measure(
                    url, registry.keys[TENANT], adapters, sizes=sizes, config=config, drive=drive
                )


def calibrate_fleet(
    base: CostModel, config: FleetCalibrateConfig, asset_dir: Path, command: str
) -> tuple[CostModel, dict[str, Any]]:
    """``base`` with the fleet's terms measured on a local demo fleet, and the samples."""
    samples, left_out = measure_fleet(config, asset_dir)
    fit = fit_fleet(base, samples)
    cores = usable_cores()
    machine = machine_record()
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    where = (
        f"`{command}` on {when}, {config.replicas} demo replicas on a local Ray cluster, "
        f"host {platform.node() or 'unknown'}, load {machine['load_1m']} at the end; "
        f"{left_out} requests left out (failed or not served from a GPU slot)"
    )
    sources = {
        "fleet_cpu_scale": f"median over {fit.decode_samples} lone warm decode requests "
        f"through the fleet of their TPOT over the base step's one-token price ({where})",
        "network_s": f"median over {fit.prefill_samples} lone warm requests through the fleet "
        f"of their TTFT less front_s, ipc_s and the scaled prefill step "
        f"({fit.raw_network_s * 1000:.2f} ms before the floor at 0; {where})",
        "network_jitter_s": "quantiles (every 5 %) of the same requests' TTFT less their "
        "prompt length and adapter's median; a fleet's hop draws from them",
        "cores": f"the CPU cores the calibrating process may run on (sched_getaffinity), where "
        f"the fleet's processes ran ({where})",
    }
    model = fleet_model(base, fit, cores, sources)
    report = {
        "samples": [asdict(s) for s in samples],
        "left_out": left_out,
        "fit": asdict(fit),
        "cores": cores,
        "machine": machine,
        "config": asdict(config),
    }
    return model, report
