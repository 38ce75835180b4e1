"""A qualification run against one deployment: set up the adapters and tenants, run every
cell with the hostile tenant beside it, retire what was added (even after a failure), then
judge every answer against the offline references and price the three methods."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.qualify.baselines.server import ServerPool
from loraplex.qualify.baselines.types import BaselineContext, MethodResult
from loraplex.qualify.cells import Cell, adapters_needed, cells
from loraplex.qualify.checks import CellVerdict, judge, reference_asks
from loraplex.qualify.client import Admin, QualifyError
from loraplex.qualify.compare import cell_traffic, comparators, loraplex_result
from loraplex.qualify.plan import QualifyPlan
from loraplex.qualify.population import (
    HOSTILE,
    VICTIMS,
    GeneratedAdapter,
    ensure_tenants,
    plan_adapters,
    register_all,
    retire,
    tenant_keys,
    write_adapters,
)
from loraplex.qualify.reference import Ask, compute
from loraplex.qualify.report import CellReport, QualifyReport, build_report
from loraplex.qualify.targets import (
    Target,
    deployed_target,
    generated_target,
    local_adapter_dirs,
)
from loraplex.qualify.traffic import CellInputs, CellRun, run_cell


@dataclass(frozen=True)
class Deployment:
    """Where the deployment is and what qualification needs on this machine."""

    url: str  # base URL of the server or fleet ingress
    admin_key: str  # its admin credential
    assets_dir: Path  # demo assets: the base model the deployment serves (references, shapes)
    preset: str  # demo preset name
    workdir: Path  # this run's files and the comparators' scratch space
    adapters_dir: Path  # generated adapters (kept between runs: the same bytes every time)
    quick: bool  # the --quick run


def qualify(plan: QualifyPlan, where: Deployment) -> QualifyReport:
    """Runs the plan against ``where``; the report says which cells failed and why."""
    model_dir = _model_dir(where.assets_dir)
    all_cells = cells(plan.matrix)
    generated = plan_adapters(
        adapters_needed(all_cells), plan.isolation.hostile_adapters, where.adapters_dir
    )
    write_adapters(generated, model_dir, plan.traffic.seed)
    start = time.monotonic()
    admin = Admin(where.url, where.admin_key, plan.traffic.request_timeout_s)
    try:
        runs, retired_failed = _run_cells(
            plan, where, admin, all_cells=all_cells, generated=generated, model_dir=model_dir
        )
    finally:
        admin.close()
    refs = compute(model_dir, [a for r in runs for a in reference_asks(r)], _max_rank(generated))
    servers = ServerPool()
    ctx = BaselineContext(
        where.assets_dir, where.preset, plan.price, where.workdir, where.quick, servers
    )
    reports = []
    try:
        for run in runs:
            verdict = judge(run, refs, plan)
            mine = loraplex_result(run, verdict, plan)
            others = _compared(plan, ctx, run, verdict, refs)
            reports.append(CellReport(run, verdict, mine, others))
    finally:
        servers.close()
    return build_report(plan, where.url, reports, retired_failed, time.monotonic() - start)


def _compared(
    plan: QualifyPlan,
    ctx: BaselineContext,
    run: CellRun,
    verdict: CellVerdict,
    refs: dict[Ask, str],
) -> dict[str, MethodResult | dict[str, Any]]:
    """The comparators' results for one cell; a cell whose traffic they cannot be given fails
    them (reported, null ratios) and the run goes on: the cells measured stay measured."""
    if not plan.compare:
        return {}
    try:
        traffic = cell_traffic(run, verdict, plan, refs)
    except ValueError as exc:
        failed = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        return dict.fromkeys(plan.compare, failed)
    return comparators(plan, ctx, traffic)


def _run_cells(
    plan: QualifyPlan, where: Deployment, admin: Admin, *, all_cells: list[Cell],
    generated: list[GeneratedAdapter], model_dir: Path,
) -> tuple[list[CellRun], list[str]]:  # fmt: skip
    ensure_tenants(admin)
    registered: list[GeneratedAdapter] = []
    extra_tenants = sorted({a.partition("/")[0] for a in plan.traffic.deployment_adapters})
    tenants = sorted({*VICTIMS, HOSTILE, *extra_tenants})
    try:
        register_all(admin, generated, registered)
        with tenant_keys(admin, tenants) as keys:
            runs = asyncio.run(
                _cells(
                    plan,
                    where,
                    admin,
                    all_cells=all_cells,
                    generated=generated,
                    keys=keys,
                    model_dir=model_dir,
                )
            )
    finally:
        failed = retire(admin, registered)
    return runs, failed


async def _cells(
    plan: QualifyPlan, where: Deployment, admin: Admin, *, all_cells: list[Cell],
    generated: list[GeneratedAdapter], keys: dict[str, str], model_dir: Path,
) -> list[CellRun]:  # fmt: skip
    by_distribution: dict[str, list[Target]] = {}
    for adapter in generated:
        if adapter.tenant != HOSTILE:
            distribution = adapter.name.rpartition("-")[0]
            by_distribution.setdefault(distribution, []).append(generated_target(adapter))
    hostile = [a.alias for a in generated if a.tenant == HOSTILE]
    local = local_adapter_dirs(where.assets_dir)
    vocab_size = int(_model_config(model_dir)["vocab_size"])
    max_len = _max_model_len(admin, keys[VICTIMS[0]], model_dir)
    rng = random.Random(plan.traffic.seed)
    runs = []
    for cell in all_cells:
        extra = [deployed_target(admin, a, local) for a in plan.traffic.deployment_adapters]
        active = by_distribution[cell.rank_distribution][: cell.active_adapters]
        inputs = CellInputs(where.url, keys, active, extra, hostile, vocab_size, max_len)
        runs.append(await run_cell(cell, inputs, plan, admin, rng))
    return runs


def _model_dir(assets_dir: Path) -> Path:
    models = sorted(p for p in (assets_dir / "models").glob("*") if p.is_dir())
    if len(models) != 1:
        raise QualifyError(
            f"--assets {assets_dir}: its models/ must hold one base model, found {len(models)}; "
            "expected the demo assets the deployment serves (`loraplex serve` on its defaults: "
            "<data dir>/demo-assets, what qualify --url reads when --assets is not given)"
        )
    return models[0]


def _model_config(model_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return config


def _max_model_len(admin: Admin, key: str, model_dir: Path) -> int:
    """The deployment's context (its base model's card), else the model's own."""
    listing = admin.call("GET", "/v1/models", key).body
    for row in listing.get("data", []) if isinstance(listing, dict) else []:
        if row.get("parent") is None and row.get("max_model_len"):
            return int(row["max_model_len"])
    return int(_model_config(model_dir)["max_position_embeddings"])


def _max_rank(generated: list[GeneratedAdapter]) -> int:
    return max([64, *(a.rank for a in generated)])
