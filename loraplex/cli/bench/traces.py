"""``loraplex bench traces``: what request traces at 100 % sampling cost in throughput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.bench.options import bad_parameter


def traces(  # noqa: PLR0917 (typer options)
    rounds: Annotated[int, typer.Option(help="Measured rounds per side (ABBA order).")] = 10,
    requests: Annotated[int, typer.Option(help="Requests per round.")] = 32,
    concurrency: Annotated[int, typer.Option(help="Requests in flight at once.")] = 8,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 32,
    engine_thread: Annotated[
        bool, typer.Option("--engine-thread", help="The engine on a thread, not a process.")
    ] = False,
    data_dir: Annotated[
        Path | None, typer.Option(help="The server's state; default: a temporary directory.")
    ] = None,
) -> None:
    """Throughput with request traces at 100 % sampling over without (docs/observability.md)."""
    import tempfile

    from loraplex.bench.traces.bench import TraceBenchConfig, run_trace_bench

    with tempfile.TemporaryDirectory(prefix="loraplex-bench-traces-") as scratch:
        with bad_parameter():
            config = TraceBenchConfig(
                data_dir=data_dir or Path(scratch),
                rounds=rounds,
                requests_per_round=requests,
                concurrency=concurrency,
                max_tokens=max_tokens,
                engine_process=not engine_thread,
            )
        typer.echo(json.dumps(run_trace_bench(config)))
