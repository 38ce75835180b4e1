"""``loraplex bench plan-check``: the planner's picks run on the real server, each on each trace
(one JSON line; docs/simulator.md, "Two traces, two picks")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loraplex.cli.registry_access import command_group

if TYPE_CHECKING:
    from loraplex.bench.sim.plan_check import Deployment


def register(app: typer.Typer) -> None:
    command_group(app, "bench", "Benchmarks.").command("plan-check")(bench_plan_check)


def deployments(text: str) -> tuple[Deployment, ...]:
    """``4:64MiB,8:16MiB`` (slots:L1 bytes per deployment) -> Deployments."""
    from loraplex.bench.sim.plan_check import Deployment
    from loraplex.cli.plan import byte_sizes

    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        slots, sep, size = part.partition(":")
        if not sep or not slots.strip().isdigit():
            raise typer.BadParameter(f"{part!r} is no SLOTS:BYTES pair", param_hint="--configs")
        (cpu,) = byte_sizes(size, "--configs")
        try:
            out.append(Deployment(int(slots), cpu))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--configs") from exc
    return tuple(out)


def bench_plan_check(
    *,
    configs: Annotated[
        str, typer.Option(help="Deployments checked, SLOTS:L1BYTES each, e.g. '4:64MiB,4:16MiB'.")
    ] = "",
    slo: Annotated[str, typer.Option(help="The planner's objectives, e.g. 'ttft_p99<=2s'.")] = "",
    traces: Annotated[
        str, typer.Option(help="Scenario names, as sim run --workload.")
    ] = "zipf-longtail,uniform",
    trace_requests: Annotated[int, typer.Option(help="Mean requests per trace.")] = 240,
    rate: Annotated[float, typer.Option(help="Mean requests per second of each trace.")] = 2.0,
    num_adapters: Annotated[int, typer.Option(help="zipf-longtail's adapters.")] = 200,
    repeats: Annotated[
        int | None, typer.Option(help="Runs of each (trace, config), ABBA (default 2).")
    ] = None,
    write_traces: Annotated[
        Path | None,
        typer.Option(help="Only write each trace as DIR/<name>.jsonl for `loraplex plan`."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Workload and prompt seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the base model is <dir>/test-small).")
    ] = Path(".loraplex-assets"),
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
) -> None:
    """Each config on each trace on a fresh real server, judged against --slo."""
    from loraplex.bench.sim.plan_check import (
        PlanCheckConfig,
        TraceSet,
        export_traces,
        run_plan_check,
    )
    from loraplex.plan.objectives import missed, parse_objectives

    names = tuple(p.strip() for p in traces.split(",") if p.strip())
    if write_traces is not None and (configs or slo or repeats is not None):
        raise typer.BadParameter(
            "--write-traces only writes traces; it takes no --configs, --slo or --repeats"
        )
    try:
        trace_set = TraceSet(
            traces=names,
            trace_requests=trace_requests,
            rate=rate,
            num_adapters=num_adapters,
            seed=seed,
        )
        if write_traces is not None:
            from loraplex.demo.assets import generate_demo_assets

            assets = generate_demo_assets(asset_dir / "test-small", preset="small", seed=0)
            written = export_traces(trace_set, assets.base_model_dir, write_traces)
            typer.echo(json.dumps(written))
            return
        if not configs or not slo:
            raise ValueError("--configs and --slo are required (or --write-traces DIR)")
        objectives = parse_objectives(slo)
        config = PlanCheckConfig(
            trace_set=trace_set,
            deployments=deployments(configs),
            slo=tuple(o.text() for o in objectives),
            repeats=2 if repeats is None else repeats,
            asset_dir=asset_dir,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    result = run_plan_check(config, lambda outcome: missed(objectives, outcome))
    if not as_json:
        for trace, cells in result["summary"].items():
            for label, cell in cells.items():
                typer.echo(f"{trace} {label}: met {cell['met']}/{cell['runs']}", err=True)
    typer.echo(json.dumps(result, allow_nan=False))
