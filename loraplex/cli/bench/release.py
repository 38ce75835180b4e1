"""``loraplex bench release``: release cycles under steady traffic through the real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.bench.options import (
    ASSET_DIR,
    REPORT_DIR,
    AsJson,
    RequestTimeoutS,
    bad_parameter,
    report_folder,
    write_report,
)


def release(
    *,
    as_json: AsJson = False,
    cycles: Annotated[int, typer.Option(help="Release cycles (a third of them bad).")] = 20,
    baseline_s: Annotated[
        float | None,
        typer.Option(help="Seconds of each phase without releases; unset: as long as B1 took."),
    ] = None,
    warmup_s: Annotated[
        float, typer.Option(help="Unmeasured traffic before the first phase.")
    ] = 3.0,
    rate: Annotated[float, typer.Option(help="Steady requests per second (Poisson).")] = 12.0,
    users_per_tenant: Annotated[int, typer.Option(help="Distinct `user` values per tenant.")] = 64,
    dwell_s: Annotated[float, typer.Option(help="Minimum seconds per canary step.")] = 3.0,
    min_requests: Annotated[int, typer.Option(help="Candidate requests a canary step needs.")] = 4,
    gpu: Annotated[
        bool, typer.Option("--gpu/--no-gpu", help="Prewarm each candidate into a GPU slot too.")
    ] = True,
    request_timeout_s: RequestTimeoutS = 30.0,
    seed: Annotated[int, typer.Option(help="Traffic seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the small set is <dir>/test-small).")
    ] = ASSET_DIR,
    report_dir: Annotated[
        str, typer.Option(help="Where release-run.md goes; '' skips it.")
    ] = REPORT_DIR,
) -> None:
    """Release cycles (good, probe-fail, live-fail) under steady traffic through the real
    server: wrong-revision answers, promotions, rollback time and the TTFT cost of releasing."""
    from loraplex.bench.release.bench import ReleaseBenchConfig, release_markdown, run_release_bench
    from loraplex.bench.release.cycles import CycleSettings
    from loraplex.bench.release.load import LoadConfig

    with bad_parameter():
        config = ReleaseBenchConfig(
            cycles=cycles,
            baseline_s=baseline_s,
            warmup_s=warmup_s,
            load=LoadConfig(
                rate=rate,
                users_per_tenant=users_per_tenant,
                request_timeout_s=request_timeout_s,
                seed=seed,
            ),
            cycle=CycleSettings(dwell_s=dwell_s, min_requests=min_requests, gpu=gpu),
            asset_dir=asset_dir,
        )
    result = run_release_bench(config)
    out = report_folder(report_dir)
    if out is not None:
        write_report(out, "release", "Release benchmark", release_markdown(result))
        if not as_json:
            typer.echo(f"report: {report_dir}/release-run.md", err=True)
    typer.echo(json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")}))
