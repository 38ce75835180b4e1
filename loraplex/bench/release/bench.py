"""``loraplex bench release``: release cycles under steady traffic through the real server.

One ``loraplex serve`` subprocess (``serve_fleet.serving``) over a registry holding the small
demo set (tenants, adapters, their output probes). Steady Zipf traffic (``release_load``) runs
the whole time; the phases run B A A B: B while half the ``cycles`` run back to back
(``release_cycles``), A without releases (as long as B1 took, unless ``baseline_s`` is given),
so drift does not favour one side and both sides see about as much traffic.
Every answer is checked against the continuation of the revision it reports
(``release_check``). See ``docs/benchmarks/release.md`` for the method and every figure.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.release.check import (
    BASELINE,
    RELEASING,
    Answer,
    CycleOutcome,
    release_metrics,
    statuses,
)
from loraplex.bench.release.cycles import AdapterState, CycleRunner, CycleSettings
from loraplex.bench.release.load import (
    Expectations,
    LoadConfig,
    Phase,
    Route,
    SteadyLoad,
    completion_body,
    stream_completion,
    to_answer,
)
from loraplex.bench.release.plan import CycleSpec, Lineage, plan_cycles
from loraplex.bench.serve.fleet import Fleet, ServerOptions, serving
from loraplex.demo.manifest import DemoAdapter, DemoAssets

ACTOR = "bench-release"
FIRST = "r1"  # the demo revision every alias starts on (the first one registered)
WARMUP = "warmup"


@dataclass(frozen=True)
class ReleaseBenchConfig:
    """What one benchmark invocation does."""

    cycles: int = 20  # release cycles, a third of them bad
    baseline_s: float | None = None  # length of each A phase; None: as long as B1 took
    warmup_s: float = 3.0  # traffic before the first phase (not measured)
    load: LoadConfig = field(default_factory=LoadConfig)  # the steady traffic
    cycle: CycleSettings = field(default_factory=CycleSettings)  # each release's plan
    max_loras: int = 16  # GPU slots of the server
    cpu_adapter_bytes: int = 256 << 20  # its L1 budget
    asset_dir: Path = Path(".loraplex-assets")  # where the small demo set is generated / reused

    def __post_init__(self) -> None:
        for name in ("cycles", "max_loras", "cpu_adapter_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.baseline_s is not None and not self.baseline_s > 0:
            raise ValueError(f"baseline_s {self.baseline_s} is invalid; expected > 0 or None")
        if self.warmup_s < 0:
            raise ValueError(f"warmup_s {self.warmup_s} is invalid; expected >= 0")


def run_release_bench(config: ReleaseBenchConfig) -> dict[str, Any]:
    """One run: name, config, seed and metrics (JSON-ready; the JSON line), plus the checked
    answers and the truth they were checked against."""
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    lineages = demo_lineages(assets)
    specs = plan_cycles(config.cycles, lineages)
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-release-") as tmp:
        root = Path(tmp)
        fleet = prepare_demo_fleet(root / "fleet", assets)
        options = ServerOptions(
            "cost_aware",
            config.max_loras,
            config.cpu_adapter_bytes,
            queue_deadline_s=config.load.request_timeout_s / 2,
        )
        with serving(fleet, root / "server", options) as url:
            answers, runner_answers, outcomes, feedback = asyncio.run(
                _drive(url, fleet, assets, specs, config)
            )
    truth = {a.ref: a.expected_continuation for a in assets.adapters}
    truth.update({o.candidate: _files_text(lineages, o) for o in outcomes})
    checked = answers + runner_answers
    metrics = release_metrics(checked, outcomes, truth, config.load.request_timeout_s)
    metrics["statuses"] = statuses(checked)
    metrics["feedback_statuses"] = feedback
    metrics["cycles"] = [asdict(o) for o in outcomes]
    plain = {**_plain(asdict(config)), "machine": machine_record()}
    return {
        "name": "release",
        "config": plain,
        "seed": config.load.seed,
        "metrics": metrics,
        "answers": checked,  # every checked answer (not in the JSON line)
        "truth": truth,  # revision ref -> the continuation its files answer (nor this)
    }


def demo_lineages(assets: DemoAssets) -> tuple[Lineage, ...]:
    """The demo adapters with several revisions (acme/support, globex/search, ...)."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for adapter in assets.adapters:
        key = (adapter.tenant, adapter.name)
        found.setdefault(key, {})[adapter.revision] = adapter.expected_continuation
    return tuple(Lineage(t, n, texts) for (t, n), texts in found.items() if len(texts) > 1)


def demo_routes(assets: DemoAssets, lineages: tuple[Lineage, ...]) -> tuple[Route, ...]:
    """One route per demo adapter, most popular first: the released adapters lead (so a
    canary step collects its minimum of requests quickly), the rest in manifest order."""
    released = [(lineage.tenant, lineage.name) for lineage in lineages]
    first: dict[tuple[str, str], DemoAdapter] = {}
    for adapter in assets.adapters:
        first.setdefault((adapter.tenant, adapter.name), adapter)
    order = released + [key for key in first if key not in released]
    return tuple(
        Route(t, n, first[(t, n)].probe_prompt, first[(t, n)].probe_max_tokens) for t, n in order
    )


def prepare_demo_fleet(root: Path, assets: DemoAssets) -> Fleet:
    """A registry with the demo tenants and revisions (with their probes) and one key per
    tenant, which the server run reaches through its config file."""
    import secrets

    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.registry import RegistryConfig, open_registry
    from loraplex.serve.bootstrap import register_demo

    base = BaseModelSpec.from_dir(assets.base_model_dir)
    rank = max(a.rank for a in assets.adapters)
    admin_key = "lpxadmin_" + secrets.token_urlsafe(24)
    fleet = Fleet(root, assets.base_model_dir, {}, admin_key, max(rank, 64))
    config = RegistryConfig(root, fleet.database_url, str(fleet.store), None, fleet.max_lora_rank)
    registry = open_registry(config, base=base)
    try:
        state = register_demo(registry, assets)
        for tenant in state.tenants:
            fleet.keys[tenant] = registry.create_key(tenant, ACTOR).token
    finally:
        registry.close()
    return fleet


async def _drive(
    url: str,
    fleet: Fleet,
    assets: DemoAssets,
    specs: tuple[CycleSpec, ...],
    config: ReleaseBenchConfig,
) -> tuple[list[Answer], list[Answer], list[CycleOutcome], dict[str, int]]:
    lineages = tuple({spec.lineage.adapter: spec.lineage for spec in specs}.values())
    routes = demo_routes(assets, demo_lineages(assets))
    expectations = Expectations(
        {r.adapter: frozenset({assets.adapter(r.tenant, r.name, FIRST).expected_continuation})
         for r in routes}
    )  # fmt: skip
    phase = Phase(WARMUP, WARMUP)
    load = SteadyLoad(
        url, fleet.keys, routes, config=config.load, phase=phase, expectations=expectations
    )
    adapters = {
        lineage.adapter: AdapterState(
            next(r for r in routes if r.adapter == lineage.adapter),
            FIRST,
            FIRST,
            {a.revision: a.path for a in assets.revisions(lineage.tenant, lineage.name)},
        )
        for lineage in lineages
    }
    headers = {"Authorization": f"Bearer {fleet.admin_key}"}
    warm = await _warm(url, fleet, routes, config.load)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as admin:
        runner = CycleRunner(admin, load, adapters, config.cycle)
        stop = asyncio.Event()
        traffic = asyncio.create_task(load.run(stop))
        outcomes: list[CycleOutcome] = []
        try:
            await asyncio.sleep(config.warmup_s)
            await _phases(runner, phase, specs, config.baseline_s, outcomes)
        finally:
            stop.set()
            await traffic
    measured = [a for a in load.answers if a.phase_kind != WARMUP]
    warmup = [a for a in load.answers if a.phase_kind == WARMUP]
    return measured, warm + warmup + runner.followups, outcomes, dict(load.feedback_statuses)


async def _phases(
    runner: CycleRunner,
    phase: Phase,
    specs: tuple[CycleSpec, ...],
    baseline_s: float | None,
    outcomes: list[CycleOutcome],
) -> None:
    """B A A B: half the cycles, two phases without releases, the other half. Each A lasts
    ``baseline_s``, or (None) as long as B1 took, so both sides get about as much traffic."""
    half = (len(specs) + 1) // 2
    plan = (
        ("B1", RELEASING, specs[:half]),
        ("A1", BASELINE, ()),
        ("A2", BASELINE, ()),
        ("B2", RELEASING, specs[half:]),
    )
    b1_s = 0.0
    for name, kind, cycles in plan:
        if kind == RELEASING and not cycles:
            continue
        phase.name, phase.kind = name, kind
        started = time.monotonic()
        if kind == BASELINE:
            await asyncio.sleep(b1_s if baseline_s is None else baseline_s)
        for spec in cycles:
            outcomes.append(await runner.run(spec))
        if name == "B1":
            b1_s = time.monotonic() - started


async def _warm(
    url: str, fleet: Fleet, routes: tuple[Route, ...], load: LoadConfig
) -> list[Answer]:
    """One request per adapter before the traffic starts, so the first phase does not pay
    every adapter's first load (checked for the revision like every answer)."""
    answers = []
    for route in routes:
        user = f"{route.tenant}-warm"
        body = completion_body(route, user)
        key = fleet.keys[route.tenant]
        result = await stream_completion(url, key, body, load.request_timeout_s)
        answers.append(to_answer(result, route, user, 0.0, (WARMUP, WARMUP)))
    return answers


def _files_text(lineages: tuple[Lineage, ...], outcome: CycleOutcome) -> str:
    lineage = next(x for x in lineages if x.adapter == outcome.adapter)
    return lineage.continuations[outcome.files_from]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


__all__ = ["ReleaseBenchConfig", "demo_lineages", "prepare_demo_fleet", "run_release_bench"]


HEADLINE = (
    "wrong_revision_answers",
    "probe_failed_candidate_answers",
    "bad_releases_promoted",
    "good_releases_promoted",
    "good_releases",
    "rollback_to_first_old_answer_ms",
    "release_p99_ttft_ratio",
    "completed_ratio_baseline",
    "completed_ratio_releasing",
    "failed_requests",
)


def release_markdown(result: dict[str, Any]) -> str:
    """The latest run as markdown: the headline figures, then one row per cycle."""
    metrics = result["metrics"]
    lines = ["| figure | value |", "|---|---|"]
    lines += [f"| `{name}` | {metrics[name]} |" for name in HEADLINE]
    for kind, figures in metrics["phases"].items():
        lines.append(f"| {kind} phases | {figures} |")
    lines += ["", "| cycle | candidate | kind | files | probe | state | s | rollback ms |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for c in metrics["cycles"]:
        lines.append(
            f"| {c['index']} | {c['candidate']} | {c['kind']} | {c['files_from']} | "
            f"{c['probe_from']} | {c['state']} | {c['duration_s']} | {c['rollback_to_old_ms']} |"
        )
    return "\n".join(lines) + "\n"
