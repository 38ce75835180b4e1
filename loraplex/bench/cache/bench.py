"""``loraplex bench cache``: per-tier load latency next to raw costs and PEFT, then trace replays
of lru vs cost_aware on identical capacities, with tier costs measured in the same run.

Every comparison runs side by side in one invocation (WORKLOADS.md); ratios are reported,
absolute times only for context. Both sides of a latency ratio are timed by one clock
(``perf_counter``) around the whole call: the cache's loads from acquire until the lease is in
hand (bookkeeping, locking, policy and executor hops included), the baselines around their own
calls; the copy floor copies into destinations allocated and touched before timing (a fresh
allocation's page faults are not part of a copy). The hot-burst replay runs at several slot
counts, under lru, lru_priority and cost_aware, with the tenants' priorities set (prio 4,
batch 0.25, as the registry's HIGH and BATCH classes): lru_priority sees the same priority
information cost_aware does, so the gain over it is the keep-score's own.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey, sha256_file
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.bench.cache.baselines import PeftLoader, raw_read
from loraplex.bench.cache.replays import replay_metrics, replay_row, run_replays
from loraplex.bench.harness.stats import ratio
from loraplex.bench.replay import ReplayResult
from loraplex.clock import ManualClock
from loraplex.model.lora import LoraSlotPool
from loraplex.residency.cache import CacheConfig, SimExecutor, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.simulated import StageCosts
from loraplex.residency.stats import Stage, percentile
from loraplex.runtime.tier_backends import ArtifactRef, DiskTier, TierPipeline

# l1_full: an L1 -> L0 load into a full L0 (a victim ranked and its slot replaced, as in a
# server with every slot taken); l1: the same load into a free slot (the history's metric).
TIER_COLUMNS = ("l3", "l2", "l1", "l1_full", "raw", "copy", "peft")


@dataclass(frozen=True)
class CacheBenchConfig:
    """What one benchmark run does."""

    presets: tuple[str, ...] = ("small", "large")  # demo presets measured
    reps: int = 7  # interleaved repetitions per adapter and variant
    max_adapters: int = 4  # adapters measured per preset
    peft: bool = True  # include PEFT's load_adapter
    duration_s: float = 600.0  # replay trace length
    rate: float = 20.0  # replay requests per second
    seed: int = 0  # workload seed
    asset_dir: Path = Path(".loraplex-assets")  # where demo assets are generated / reused

    def __post_init__(self) -> None:
        for name in ("reps", "max_adapters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")


def run_cache_bench(config: CacheBenchConfig) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {}
    stage_rates: list[dict[str, float]] = []
    for preset in config.presets:
        samples[preset], rates = _measure_preset(preset, config)
        stage_rates.append(rates)
    costs = StageCosts(per_move_s=0.0, **stage_rates[0])
    replays = run_replays(config.duration_s, config.rate, config.seed, costs)
    return _result(config, samples, costs, replays)


# --- per-tier latency ----------------------------------------------------------------------


def _measure_preset(
    preset: str, config: CacheBenchConfig
) -> tuple[dict[str, list[float]], dict[str, float]]:
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / f"bench-{preset}", preset=preset, seed=0)
    base = BaseModelSpec.from_dir(assets.base_model_dir)
    dirs = [a.path for a in assets.adapters[: config.max_adapters]]
    max_rank = max(validate_adapter_dir(d, base, 1 << 16).max_rank for d in dirs)
    with tempfile.TemporaryDirectory() as tmp:
        rig = _Rig(Path(tmp), base, max_rank)
        keys = [rig.register(d, i) for i, d in enumerate(dirs)]
        # The full-L0 load needs other adapters to fill every slot: with fewer measured adapters
        # than that, the first one's files are registered again under other names (untimed).
        fillers = [
            rig.register(dirs[0], len(dirs) + i)
            for i in range(max(0, rig.pool.num_slots + 1 - len(dirs)))
        ]
        peft = PeftLoader(assets.base_model_dir, dirs[0]) if config.peft else None
        out: dict[str, list[float]] = {c: [] for c in TIER_COLUMNS}
        for _ in range(config.reps):
            for key, path in zip(keys, dirs, strict=True):
                out["l3"].append(rig.load_from(key, Tier.L3))
                out["l2"].append(rig.load_from(key, Tier.L2))
                out["l1"].append(rig.load_from(key, Tier.L1))
                out["l1_full"].append(rig.load_into_full_l0(key, keys + fillers))
                out["raw"].append(raw_read(path / "adapter_model.safetensors"))
                out["copy"].append(rig.plain_copy(key))
                if peft is not None:
                    out["peft"].append(peft.load(path))
        rates = rig.stage_rates()
    return out, rates


class _Rig:
    """A real cache over a local store, a disk tier and a 2-slot pool; loads run inline."""

    def __init__(self, root: Path, base: BaseModelSpec, max_rank: int) -> None:
        self.store = LocalArtifactStore(root / "store")
        self.refs: dict[AdapterKey, ArtifactRef] = {}
        self.pool = LoraSlotPool(base, 2, max_rank, dtype=torch.float32, device=torch.device("cpu"))
        self.pipeline = TierPipeline(
            self.refs.__getitem__, self.store, DiskTier(root / "l2"), self.pool, base
        )
        budgets = {
            Tier.L0: TierBudget(2 * self.pool.bytes_per_slot, 2),
            Tier.L1: TierBudget(1 << 34),
            Tier.L2: TierBudget(1 << 36),
        }
        self.clock = ManualClock()
        self.executor = SimExecutor(self.clock)
        self.cache = TieredAdapterCache(
            CacheConfig(budgets), self.pipeline, clock=self.clock, executor=self.executor
        )
        self.base = base
        self._copy_dests: dict[AdapterKey, list[torch.Tensor]] = {}  # plain_copy's buffers

    def register(self, path: Path, index: int) -> AdapterKey:
        files = [path / "adapter_config.json", path / "adapter_model.safetensors"]
        digests = [sha256_file(f) for f in files]
        for f, d in zip(files, digests, strict=True):
            self.store.put_file(f, d)
        key = AdapterKey(self.base.digest, "bench", f"a{index}", "r1", digests[1])
        validated = validate_adapter_dir(path, self.base, self.pool.max_lora_rank)
        memory = sum(m.rank * (m.d_in + m.d_out) for m in validated.modules) * 4
        self.refs[key] = ArtifactRef(
            digests[0], digests[1], sum(f.stat().st_size for f in files), memory
        )
        return key

    def load_from(self, key: AdapterKey, source: Tier) -> float:
        """Seconds to bring ``key`` into L0 with its nearest copy in ``source``: acquire until
        the lease is in hand, end to end (the evictions setting up the source are not timed)."""
        for tier in (Tier.L0, Tier.L1, Tier.L2):
            if tier < source:
                self.cache.evict(key, tier)
        return self._timed_load(key, source)

    def load_into_full_l0(self, key: AdapterKey, keys: Sequence[AdapterKey]) -> float:
        """Seconds to bring ``key`` from L1 into an L0 whose slots all hold other adapters
        (idle): the load ranks a victim and replaces its slot, as in a server with a full L0.
        Setting up (evicting ``key`` from L0, filling L0 with others) is not timed."""
        self.cache.evict(key, Tier.L0)
        others = [k for k in keys if k != key]
        for other in others:  # fill the free slots with other adapters, untimed
            if len(self.cache.residency(Tier.L0)) >= self.pool.num_slots:
                break
            if not self.cache.is_resident(other, Tier.L0):
                future = self.cache.acquire_future(other)
                self.executor.drain()
                future.result(timeout=0).release()
        before = set(self.cache.residency(Tier.L0))
        if len(before) < self.pool.num_slots or key in before:
            raise RuntimeError(f"L0 is not full of other adapters before the load: {len(before)}")
        elapsed = self._timed_load(key, Tier.L1)
        if not before - set(self.cache.residency(Tier.L0)):
            raise RuntimeError("the load into a full L0 replaced no victim")
        return elapsed

    def _timed_load(self, key: AdapterKey, source: Tier) -> float:
        """Seconds from acquire until the lease is in hand; the load must come from ``source``."""
        start = time.perf_counter()
        future = self.cache.acquire_future(key)
        self.executor.drain()
        lease = future.result(timeout=0)
        elapsed = time.perf_counter() - start
        lease.release()
        if lease.load.source is not source:
            raise RuntimeError(f"expected a load from {source.name}, got {lease.load.source.name}")
        return elapsed

    def plain_copy(self, key: AdapterKey) -> float:
        """The same tensors copied into buffers allocated and touched once per adapter, before
        any timing (the floor of an L1 -> L0 move, without first-touch page faults)."""
        weights = self.pipeline.memory.get(key)
        sources = [t for m in weights.modules for t in (m.lora_a, m.lora_b)]
        dests = self._copy_dests.get(key)
        if dests is None:
            dests = [torch.zeros_like(t) for t in sources]  # zeros: every page touched now
            self._copy_dests[key] = dests
        start = time.perf_counter()
        for source, dest in zip(sources, dests, strict=True):
            dest.copy_(source)
        return time.perf_counter() - start

    def stage_rates(self) -> dict[str, float]:
        stages = self.cache.snapshot().stats.stages
        disk = statistics.median(r.disk_bytes for r in self.refs.values())
        memory = statistics.median(r.memory_bytes for r in self.refs.values())
        return {
            "fetch_bytes_per_s": disk / max(stages[Stage.FETCH].p50_s, 1e-9),
            "verify_bytes_per_s": disk / max(stages[Stage.VERIFY].p50_s, 1e-9),
            "read_bytes_per_s": disk / max(stages[Stage.READ].p50_s, 1e-9),
            "copy_bytes_per_s": memory / max(stages[Stage.COPY].p50_s, 1e-9),
            "resolve_s": stages[Stage.RESOLVE].p50_s,
            "commit_s": stages[Stage.COMMIT].p50_s,
        }


# --- result ------------------------------------------------------------------------------------


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {f"p{q}_ms": 1000 * percentile(ordered, q / 100) for q in (50, 95, 99)}


def load_metrics(
    presets: Sequence[str], med: Callable[[str, str], float | None], *, peft: bool
) -> dict[str, float | None]:
    """Load-latency ratios of medians ``med(preset, column)``: the first preset's unprefixed,
    every other preset's under ``<preset>_``. Undefined (a missing median) is None."""
    metrics: dict[str, float | None] = {}
    for index, preset in enumerate(presets):
        prefix = "" if index == 0 else f"{preset}_"
        metrics[f"{prefix}l2_load_over_raw"] = ratio(med(preset, "l2"), med(preset, "raw"), None)
        if peft or index == 0:  # the first preset's key is always there (null without PEFT)
            metrics[f"{prefix}l2_load_speedup_vs_peft"] = ratio(
                med(preset, "peft"), med(preset, "l2"), None
            )
        metrics[f"{prefix}l1_to_l0_over_copy"] = ratio(med(preset, "l1"), med(preset, "copy"), None)
        metrics[f"{prefix}l1_to_l0_full_over_copy"] = ratio(
            med(preset, "l1_full"), med(preset, "copy"), None
        )
    return metrics


def _result(
    config: CacheBenchConfig,
    samples: dict[str, dict[str, list[float]]],
    costs: StageCosts,
    replays: dict[str, dict[str, ReplayResult]],
) -> dict[str, Any]:
    def med(preset: str, column: str) -> float | None:
        values = samples[preset][column]
        return statistics.median(values) if values else None

    metrics = {**load_metrics(config.presets, med, peft=config.peft), **replay_metrics(replays)}
    latency = {p: {c: _quantiles(v) for c, v in cols.items() if v} for p, cols in samples.items()}
    return {
        "name": "cache",
        "config": {
            "presets": list(config.presets),
            "reps": config.reps,
            "max_adapters": config.max_adapters,
            "peft": config.peft,
            "duration_s": config.duration_s,
            "rate": config.rate,
        },
        "seed": config.seed,
        "metrics": {k: None if v is None else round(v, 4) for k, v in metrics.items()},
        "latency": latency,
        "stage_costs": vars(costs),
        "replays": {n: {p: replay_row(r) for p, r in pols.items()} for n, pols in replays.items()},
    }
