"""``loraplex bench baselines``: the qualification comparators (separate merged deployments,
in-context examples) measured on the demo set, one JSON line (docs/qualification.md)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.assets import preset_option
from loraplex.cli.bench import bench_app

NOMINAL_SOURCE = "nominal: 1 USD per machine-hour (every cost scales linearly with the price)"


def register(app: typer.Typer) -> None:
    del app  # the command joins the ``bench`` group, which cli.bench registers
    bench_app.command("baselines")(bench_baselines)


def bench_baselines(
    *,
    assets: Annotated[Path, typer.Option(help="A generated demo set (its manifest.json).")] = Path(
        ".loraplex-assets/test-small"
    ),
    preset: Annotated[
        str, typer.Option(help="The preset that set was generated with.", parser=preset_option)
    ] = "small",
    shapes: Annotated[str, typer.Option(help="Token shapes, comma-separated.")] = (
        "short,long-prompt,long-output"
    ),
    adapters: Annotated[int, typer.Option(help="Demo adapters in each cell.")] = 4,
    demand_rps: Annotated[float, typer.Option(help="Requests/s per adapter.")] = 0.1,
    wall_s: Annotated[float, typer.Option(help="Each cell's traffic duration.")] = 60.0,
    ttft_slo_s: Annotated[float, typer.Option(help="TTFT objective (s).")] = 1.0,
    tpot_slo_s: Annotated[float, typer.Option(help="TPOT objective (s).")] = 0.1,
    usd_per_hour: Annotated[float, typer.Option(help="Machine price per hour.")] = 1.0,
    quick: Annotated[bool, typer.Option("--quick", help="Two load levels, one merge.")] = False,
    workdir: Annotated[
        Path | None, typer.Option(help="Servers, merged models, cache; default: temporary.")
    ] = None,
) -> None:
    """Separate merged deployments and in-context examples on the demo set, per token shape."""
    from loraplex.qualify.baselines.demo_set import load_assets
    from loraplex.qualify.baselines.report import BaselinesBench, run_baselines_bench
    from loraplex.qualify.baselines.types import BaselineContext
    from loraplex.qualify.cost import MachinePrice

    with tempfile.TemporaryDirectory(prefix="loraplex-baselines-") as scratch:
        try:
            price = MachinePrice("nominal", usd_per_hour, NOMINAL_SOURCE)
            ctx = BaselineContext(assets.resolve(), preset, price, workdir or Path(scratch), quick)
            load_assets(ctx)  # the preset must be the set's own
            bench = BaselinesBench(
                tuple(s.strip() for s in shapes.split(",") if s.strip()),
                adapters,
                demand_rps,
                wall_s,
                ttft_slo_s,
                tpot_slo_s,
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        typer.echo(json.dumps(run_baselines_bench(ctx, bench)))
