"""``loraplex bench execution``: the mixed-adapter batch against base, single and PEFT."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from loraplex.cli.bench.options import (
    REPORT_DIR,
    AsJson,
    Preset,
    Rounds,
    Threads,
    bad_parameter,
    report_folder,
    write_report,
)
from loraplex.cli.given import given


def execution(
    ctx: typer.Context,
    *,
    preset: Preset = "small",
    as_json: AsJson = False,
    quick: Annotated[
        bool, typer.Option(help="Headline only, float32, 3 rounds (an explicit --rounds wins).")
    ] = False,
    no_peft: Annotated[bool, typer.Option("--no-peft", help="Skip PEFT's mixed batch.")] = False,
    threads: Threads = 1,
    rounds: Rounds = 12,
    seed: Annotated[int, typer.Option(help="Seed of adapter weights and popularity.")] = 0,
    device: Annotated[str, typer.Option(help="cpu or cuda: where the models run.")] = "cpu",
    dtype: Annotated[
        str,
        typer.Option(help="Headline dtypes, comma-separated; '' = float32 (--quick) or both."),
    ] = "",
    backend: Annotated[
        str, typer.Option(help="LoRA op backend of the mixed pools (auto, triton, grouped, ...).")
    ] = "auto",
    batch_size: Annotated[
        int, typer.Option(help="Headline sequences per step, over its 16 adapters.")
    ] = 16,
    report_dir: Annotated[
        str, typer.Option(help="Where execution-run.md and execution.png go; '' skips them.")
    ] = REPORT_DIR,
) -> None:
    """Mixed-adapter execution: base, single, mixed and PEFT side by side."""
    import torch

    from loraplex.bench.execution.bench import ExecutionBenchConfig, run_execution_bench
    from loraplex.bench.report import execution_markdown, execution_plot

    torch.set_num_threads(threads)
    dtypes = tuple(d for d in dtype.split(",") if d) or (
        ("float32",) if quick else ("float32", "bfloat16")
    )
    with bad_parameter():
        config = ExecutionBenchConfig(
            preset=preset,
            dtypes=dtypes,
            rounds=3 if quick and not given(ctx, "rounds") else rounds,
            matrix=not quick,
            peft=not no_peft,
            seed=seed,
            device=device,
            backend=backend,
            batch_size=batch_size,
        )
        result = run_execution_bench(config)
    out = report_folder(report_dir)
    if out is not None:
        execution_plot(result, out / "execution.png")
        markdown = execution_markdown(result, "execution.png")
        write_report(out, "execution", "Execution benchmark", markdown)
    line = json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")})
    if not as_json:
        typer.echo(f"report: {report_dir}/execution-run.md", err=True)
    typer.echo(line)
