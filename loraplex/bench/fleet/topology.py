"""``loraplex bench fleet --topology``: issue 28's fleet topology measured on a real fleet.

Two sides, the same fleet otherwise (``replicas`` engine replicas, the default routing policy,
every trace adapter in the slot pools): ``unmerged`` (every replica ``mode = "unmerged"``, no
``[fleet] topology``: the always-unmerged baseline the Done-when names) and ``auto+topology``
(every replica ``mode = "auto"`` and ``[fleet] topology`` on with its defaults: one replica may
be dedicated to a revision whose share would fill one, ``router/topology.py``).

Traces (open loop, Gamma arrivals with cv 1 at one rate for both sides): ``skewed80``, about
80 % of the tokens on one revision and the rest over 15 others, and ``uniform16``, 16 revisions
in turn, both drawn by ``bench modes``' own generator (``bench.modes.replay.trace``: the same
slot draw, prompt length and 8-24 generated tokens) with the same 16 revisions (ranks 8-64 as in
``bench modes``, the hot one rank 16, every target module). The rate is ``load`` times the
capacity of the baseline fleet, measured first (``bench fleet``'s bursts, of the first trace's
mix), unless given.

Each run deploys a fresh fleet, replays an unmeasured warm-up of the trace (another seed; the
dedication and the merge may happen there), replays the trace, reads the decisions by reason
over the trace alone, then sends greedy probes (every revision and the base model, one at a
time) whose outputs must be identical on every run of every side. A poller reads the fleet
board and ``/admin/fleet`` every ``POLL_S`` from the start of the warm-up: the times (seconds
from the measured replay's start; negative: during the warm-up) at which a replica's merged
revision changed and at which the first ``merged`` routing decision was counted. Sides run in
ABBA order per repeat (``harness.order.run_order``); figures are medians over the repeats with
their [min, max] and the headline ratios are taken per repeat pair.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.fleet.bench import FleetTarget, deployment_settings
from loraplex.bench.fleet.drive import measure_capacity, median_or_none, replay
from loraplex.bench.fleet.repeats import aggregate, median_of, spread_of
from loraplex.bench.fleet.report import Headline, PolicyRun, headline_repeats, repeat_figures
from loraplex.bench.harness.machine import machine_record
from loraplex.bench.harness.order import run_order
from loraplex.bench.harness.stats import ratio
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, prompt_ids
from loraplex.bench.serve.fleet import (
    drop_page_cache,
    prepare_fleet,
)
from loraplex.bench.workloads import ALL_TARGETS, TraceAdapter, TraceRequest, gamma_arrivals
from loraplex.residency.policy import DEFAULT_POLICY as EVICTION_POLICY

UNMERGED, TOPOLOGY = "unmerged", "auto+topology"
SIDES = (UNMERGED, TOPOLOGY)  # forward run order (ABBA alternates it)
TRACE_SHARES: dict[str, float | None] = {"skewed80": 0.8, "uniform16": None}  # hot share
TENANT = "modes"  # the one tenant owning the 16 revisions
NUM_REVISIONS = 16  # bench modes' NUM_ADAPTERS
RANKS = (8, 16, 32, 64)  # bench modes' ranks, cycled from the hot revision's
HOT_RANK = 16  # bench modes' default hot rank
OUTPUT_TOKENS = (8, 24)  # generated tokens per request, inclusive (bench modes' replay)
MAX_LORA_RANK = 64
RAY_CPUS = 1  # as ``bench fleet``
POLL_S = 1.0  # the transition poller's period
PROBE_TOKENS = 8  # greedy tokens per probe
PROBE_PROMPT_TOKENS = 16
_POSITIVE_INTS = (
    "repeats",
    "replicas",
    "max_loras",
    "torch_threads",
    "trace_requests",
    "prompt_tokens",
    "capacity_requests",
    "capacity_rounds",
)
HEADLINES = (
    Headline("tokens_per_s_topology_over_unmerged", "tokens_per_s", TOPOLOGY, UNMERGED, ">= 1.1"),
    Headline("p99_ttft_topology_over_unmerged", "p99_ttft_ms", TOPOLOGY, UNMERGED, "<= 1.1"),
)


class ProbeMismatchError(RuntimeError):
    """A greedy probe's output differed between runs (sides or repeats)."""


@dataclass(frozen=True)
class TopologyBenchConfig:
    """What one ``bench fleet --topology`` invocation does."""

    traces: tuple[str, ...] = tuple(TRACE_SHARES)
    repeats: int = 3  # ABBA pairs per trace (medians over them)
    replicas: int = 2  # engine replicas per fleet (the dedication needs >= 2)
    max_loras: int = NUM_REVISIONS  # GPU slots per replica: every revision fits
    torch_threads: int = 1  # torch threads per replica
    cpu_adapter_bytes: int = 64 << 20  # L1 budget per replica
    trace_requests: int = 384  # mean requests of a trace (its duration at the rate)
    warmup_requests: int = 96  # mean requests of the unmeasured warm-up (0: none)
    rate: float | None = None  # requests per second; None: load x measured capacity
    load: float = 0.9  # trace rate as a fraction of the baseline fleet's capacity
    prompt_tokens: int = 64  # prompt tokens of every request
    request_timeout_s: float = 30.0  # bound on a request; failures count at it
    capacity_requests: int = 64  # requests of one capacity burst
    capacity_rounds: int = 2  # measured capacity bursts (the median counts)
    seed: int = 0
    asset_dir: Path = Path(".loraplex-assets")  # the base model is <dir>/test-small

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is invalid; expected an int >= 1")
        if self.replicas < 2:
            raise ValueError(
                f"replicas {self.replicas} is invalid; expected >= 2 (topology dedicates none "
                "below its min_replicas, 2)"
            )
        warmup = self.warmup_requests
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup_requests {warmup!r} is invalid; expected an int >= 0")
        for name in ("load", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate {self.rate} is invalid; expected > 0 or None (measured)")
        unknown = [t for t in self.traces if t not in TRACE_SHARES]
        if not self.traces or unknown or len(set(self.traces)) != len(self.traces):
            raise ValueError(
                f"traces {list(self.traces)} is invalid; expected distinct names from "
                f"{list(TRACE_SHARES)}"
            )

    def plain(self) -> dict[str, Any]:
        values = asdict(self)
        values["asset_dir"] = str(self.asset_dir)
        return {
            **values,
            "sides": list(SIDES),
            "eviction_policy": EVICTION_POLICY,
            "output_tokens": list(OUTPUT_TOKENS),
            "hot_rank": HOT_RANK,
            "probe_tokens": PROBE_TOKENS,
        }


def revisions() -> tuple[TraceAdapter, ...]:
    """The 16 revisions: ``modes/rev00`` (the hot one, rank 16) .. ``rev15``, ranks cycling
    through 8-64 from the hot one's, every target module (bench modes' ``slot_rank``)."""
    start = RANKS.index(HOT_RANK)
    return tuple(
        TraceAdapter(TENANT, f"rev{i:02d}", RANKS[(start + i) % len(RANKS)], ALL_TARGETS)
        for i in range(NUM_REVISIONS)
    )


def topology_trace(
    name: str, seed: int, rate: float, num_requests: int, prompt_tokens: int
) -> tuple[TraceRequest, ...]:
    """Trace ``name`` at ``rate`` for about ``num_requests`` requests: Gamma (cv 1) arrivals,
    revisions and lengths from ``bench modes``' generator (``replay.trace``)."""
    from loraplex.bench.modes.replay import trace

    rng = random.Random(seed)
    times = gamma_arrivals(rng, rate, 1.0, num_requests / rate)
    drawn = trace(
        rng, len(times), TRACE_SHARES[name], prompt_tokens, 4, output_tokens=OUTPUT_TOKENS
    )
    return tuple(
        TraceRequest(round(t, 6), TENANT, f"rev{r.slot or 0:02d}", len(r.prompt), r.max_tokens)
        for t, r in zip(times, drawn, strict=True)
    )


def hot_token_share(requests: Sequence[TraceRequest]) -> float | None:
    """``rev00``'s share of the trace's tokens (prompt + generated)."""
    total = sum(r.prompt_tokens + r.output_tokens for r in requests)
    hot = sum(r.prompt_tokens + r.output_tokens for r in requests if r.adapter == "rev00")
    return ratio(hot, total, 4)


def tokens_per_s(
    records: Sequence[RequestRecord], requests: Sequence[TraceRequest], wall_s: float
) -> dict[str, float | None]:
    """Completed requests' tokens (prompt + generated; generated alone) per second of the
    replay's wall time (its start to the last answer); a failed request adds nothing."""
    done = [(r, q) for r, q in zip(records, requests, strict=True) if r.ok]
    prompt = sum(q.prompt_tokens for _, q in done)
    generated = sum(r.completion_tokens for r, _ in done)
    return {
        "tokens_per_s": ratio(prompt + generated, wall_s, 2),
        "output_tokens_per_s": ratio(generated, wall_s, 2),
    }


@dataclass
class Timeline:
    """What the poller saw: (t_s, replica, merged revision) on every change of a replica's
    merged revision, and when the first ``merged`` routing decision was counted."""

    merges: list[dict[str, Any]] = field(default_factory=list)
    first_merged_decision_s: float | None = None
    transitions: dict[str, Any] = field(default_factory=dict)  # histograms at the end


class TransitionPoller:
    """Polls the board and ``/admin/fleet`` on a thread every ``POLL_S`` (both sides alike)."""

    def __init__(self, url: str, admin_key: str) -> None:
        self._url, self._admin_key = url, admin_key
        self._stop = threading.Event()
        self._seen: dict[str, str | None] = {}
        self._events: list[tuple[float, str, str | None]] = []
        self._first_merged: float | None = None
        self._modes: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TransitionPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30.0)

    def _run(self) -> None:
        from loraplex.bench.fleet.cluster import board_entries, fleet_state

        while not self._stop.is_set():
            now = time.monotonic()
            try:
                for entry in board_entries():
                    mode = getattr(entry.status.get("load"), "mode", None)
                    merged = None if mode is None else mode.merged_revision
                    rid = str(entry.replica_id)
                    if mode is not None:
                        self._modes[rid] = mode
                    known = rid in self._seen
                    if (known and self._seen[rid] != merged) or (not known and merged):
                        self._events.append((now, rid, merged))
                    self._seen[rid] = merged
                decisions = fleet_state(self._url, self._admin_key)["decisions"]
                if self._first_merged is None and decisions.get("merged", 0) > 0:
                    self._first_merged = now
            except Exception:  # a read that fails is retried at the next tick
                pass
            self._stop.wait(POLL_S)

    def timeline(self, start: float) -> Timeline:
        """Times relative to ``start`` (the measured replay's start), rounded to 0.1 s."""
        replicas = sorted(self._seen)
        names = {rid: f"r{i}" for i, rid in enumerate(replicas)}
        merges = [
            {"t_s": round(t - start, 1), "replica": names.get(rid, rid), "merged": merged}
            for t, rid, merged in self._events
        ]
        first = self._first_merged
        transitions = {
            names.get(rid, rid): {
                "merges": mode.merge.num_observed,
                "unmerges": mode.unmerge.num_observed,
                "merge_ms_mean": ratio(1000 * mode.merge.sum_s, mode.merge.num_observed, 2),
            }
            for rid, mode in self._modes.items()
        }
        return Timeline(merges, None if first is None else round(first - start, 1), transitions)


@dataclass(frozen=True)
class SideRun:
    """One deployment of one side replaying one trace."""

    trace: str
    side: str
    requests: tuple[TraceRequest, ...]  # the trace replayed
    records: tuple[RequestRecord, ...]  # one per request, in trace order
    wall_s: float  # the replay's start to its last answer
    decisions: Mapping[str, int]
    timeline: Timeline
    probes: Mapping[str, str]  # revision (or "base") -> greedy text


def side_figures(run: SideRun, timeout_s: float) -> dict[str, Any]:
    """One run's figures: ``bench fleet``'s per-repeat figures (requests, completion, TTFT
    with failures at the timeout), tokens per second, decisions and the timeline."""
    base = repeat_figures(PolicyRun(run.trace, run.side, run.records, (), run.decisions), timeout_s)
    keep = ("requests", "completed", "completed_ratio", "ttft_ms")
    return {
        **{k: base[k] for k in keep},
        **tokens_per_s(run.records, run.requests, run.wall_s),
        "wall_s": round(run.wall_s, 2),
        "decisions": dict(sorted(run.decisions.items())),
        "merges": run.timeline.merges,
        "first_merged_decision_s": run.timeline.first_merged_decision_s,
        "transitions": run.timeline.transitions,
    }


MEDIANS = ("completed_ratio", "ttft_ms", "tokens_per_s", "output_tokens_per_s")


def topology_metrics(
    runs: Sequence[SideRun], traces: Sequence[str], timeout_s: float
) -> dict[str, Any]:
    """Per trace: each side's medians (with their spread) and per-repeat figures, and the
    headline ratios per repeat pair (median, [min, max], per repeat; None where undefined)."""
    out: dict[str, Any] = {}
    for trace in traces:
        figures = {
            side: [side_figures(r, timeout_s) for r in runs if r.trace == trace and r.side == side]
            for side in SIDES
        }
        m: dict[str, Any] = {}
        for h in HEADLINES:
            values = headline_repeats(figures, h)
            m[h.name] = median_of(values, 3)
            m.setdefault("spread", {})[h.name] = spread_of(values)
            m.setdefault("per_repeat", {})[h.name] = values
        m["sides"] = {
            side: {"runs": len(f), **aggregate(f, MEDIANS), "repeats": f}
            for side, f in figures.items()
            if f
        }
        out[trace] = m
    return out


def probe_check(runs: Sequence[SideRun]) -> dict[str, Any]:
    """Every probe's output compared over every run: the count identical everywhere and each
    one that differs (its outputs by run)."""
    names = sorted({name for run in runs for name in run.probes})
    mismatches = []
    for name in names:
        outputs = {f"{r.trace}/{r.side}#{i}": r.probes.get(name) for i, r in enumerate(runs)}
        if len(set(outputs.values())) != 1:
            mismatches.append({"probe": name, "outputs": outputs})
    return {"probes": len(names), "runs": len(runs), "identical": len(names) - len(mismatches),
            "mismatches": mismatches}  # fmt: skip


# --- the real fleet --------------------------------------------------------------------------


def run_topology_bench(config: TopologyBenchConfig) -> dict[str, Any]:
    """Every run; the result has name, config, seed, metrics (``probes``: the check) and runs."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.fleet.cluster import local_cluster
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    drive = DriveConfig(
        request_timeout_s=config.request_timeout_s, vocab_size=vocab, seed=config.seed
    )
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-topology-") as tmp:
        root = Path(tmp)
        registry = prepare_fleet(
            root / "registry", assets.base_model_dir, revisions(), MAX_LORA_RANK, config.seed
        )
        with local_cluster(RAY_CPUS) as port:
            target = FleetTarget(registry, f"http://127.0.0.1:{port}", port, root)
            capacity: tuple[float, ...] = ()
            rate = config.rate
            if rate is None:
                capacity = _capacity(config, target, drive)
                measured = median_or_none(capacity) or 0.0
                if not measured > 0:
                    raise RuntimeError(f"measured capacity {capacity} req/s leaves no rate")
                rate = config.load * measured
            traces = {
                t: topology_trace(t, config.seed, rate, config.trace_requests, config.prompt_tokens)
                for t in config.traces
            }
            runs, order = _side_runs(config, target, traces, rate, drive)
    metrics = topology_metrics(runs, config.traces, config.request_timeout_s)
    metrics["probes"] = probe_check(runs)
    metrics["capacity_rps"] = [round(v, 3) for v in capacity]
    metrics["trace_rate"] = round(rate, 3)
    metrics["hot_token_share"] = {t: hot_token_share(r) for t, r in traces.items()}
    metrics["trace_requests"] = {t: len(r) for t, r in traces.items()}
    metrics["run_order"] = order
    return {
        "name": "fleet-topology",
        "config": {**config.plain(), "machine": machine_record()},
        "seed": config.seed,
        "metrics": metrics,
        "runs": runs,
    }


def _capacity(
    config: TopologyBenchConfig, target: FleetTarget, drive: DriveConfig
) -> tuple[float, ...]:
    """Completed requests per second of bursts of the first trace's mix on the baseline."""
    from loraplex.bench.fleet.cluster import deployed

    settings = deployment_settings(config, target, target.root / "capacity")
    mix = topology_trace(
        config.traces[0], config.seed + 7, 1.0, config.capacity_requests, config.prompt_tokens
    )
    batch = [replace(r, t_s=0.0) for r in mix[: config.capacity_requests]]
    with deployed(settings, target.url, target.registry.admin_key):
        keys = target.registry.keys
        return measure_capacity(target.url, batch, keys, drive, config.capacity_rounds)


def _side_runs(
    config: TopologyBenchConfig,
    target: FleetTarget,
    traces: Mapping[str, tuple[TraceRequest, ...]],
    rate: float,
    drive: DriveConfig,
) -> tuple[list[SideRun], list[str]]:
    from loraplex.bench.fleet.cluster import deployed, fleet_state

    runs, names = [], []
    admin_key, keys = target.registry.admin_key, target.registry.keys
    names_of = list(traces)
    for index, (group, member) in enumerate(run_order([len(SIDES)] * len(traces), config.repeats)):
        trace, side = names_of[group], SIDES[member]
        names.append(f"{trace}/{side}")
        settings = deployment_settings(
            config,
            target,
            target.root / f"run-{index}",
            mode="auto" if side == TOPOLOGY else "unmerged",  # only these two differ
            topology={} if side == TOPOLOGY else None,
        )
        drop_page_cache(target.registry.store)
        warmup: tuple[TraceRequest, ...] = ()
        if config.warmup_requests:
            warmup = topology_trace(
                trace, config.seed + 1, rate, config.warmup_requests, config.prompt_tokens
            )
        with (
            deployed(settings, target.url, admin_key),
            TransitionPoller(target.url, admin_key) as poller,
        ):
            if warmup:
                asyncio.run(replay(target.url, warmup, keys, replace(drive, seed=drive.seed + 1)))
            before = fleet_state(target.url, admin_key)["decisions"]
            start = time.monotonic()
            records = asyncio.run(replay(target.url, traces[trace], keys, drive))
            wall_s = time.monotonic() - start
            after = fleet_state(target.url, admin_key)["decisions"]
            probes = greedy_probes(target.url, keys[TENANT], drive.vocab_size, config.seed)
        decided = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
        runs.append(
            SideRun(
                trace,
                side,
                traces[trace],
                tuple(records),
                wall_s,
                decided,
                poller.timeline(start),
                probes,
            )
        )
    return runs, names


def greedy_probes(url: str, key: str, vocab: int, seed: int) -> dict[str, str]:
    """Each revision's and the base model's greedy continuation of one fixed prompt, one
    request at a time (no batching partner: the output depends on the weights alone)."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60.0) as client:
        listed = client.get("/v1/models").json()["data"]
        base = next(m["id"] for m in listed if not m.get("parent"))
        out = {}
        for model in [base, *(a.name for a in revisions())]:
            ids = prompt_ids(random.Random(f"{seed}/{model}"), PROBE_PROMPT_TOKENS, vocab)
            body = {"model": model, "prompt": ids, "max_tokens": PROBE_TOKENS,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            reply = client.post("/v1/completions", json=body)
            reply.raise_for_status()
            out["base" if model == base else model] = reply.json()["choices"][0]["text"]
    return out


def topology_table(result: Mapping[str, Any]) -> str:
    """The human summary: per trace, one row per side (medians [min-max]), the headline ratios
    with their spread, each side's decisions and merges; then the probes and the rate."""
    m = result["metrics"]
    lines = [f"rate {m['trace_rate']} req/s (capacity bursts {m['capacity_rps']})"]
    for trace in result["config"]["traces"]:
        t = m[trace]
        lines.append(f"{trace} (hot token share {m['hot_token_share'][trace]}):")
        for side, s in t["sides"].items():
            spread = s["spread"]
            lines.append(
                f"  {side:<14} tokens/s {s['tokens_per_s']} {spread['tokens_per_s']}"
                f"  ttft p50 {s['ttft_ms']['p50']} ms  p99 {s['ttft_ms']['p99']} ms "
                f"{spread['ttft_ms']['p99']}  done {s['completed_ratio']}"
            )
            for i, rep in enumerate(s["repeats"]):
                lines.append(
                    f"    #{i} decisions {rep['decisions']} merges {rep['merges']} "
                    f"first merged decision {rep['first_merged_decision_s']} s"
                )
        for h in HEADLINES:
            lines.append(
                f"  {h.name} {t[h.name]} {t['spread'][h.name]} (issue's target {h.target})"
            )
    p = m["probes"]
    lines.append(f"probes: {p['identical']} of {p['probes']} identical over {p['runs']} runs")
    return "\n".join(lines)
