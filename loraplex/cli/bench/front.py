"""``loraplex bench front``: the HTTP process of ``loraplex serve`` (memory, start to ready)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loraplex.cli.bench.options import ASSET_DIR, bad_parameter

if TYPE_CHECKING:
    from loraplex.bench.front.bench import Tree


def front(
    *,
    tree: Annotated[
        list[str] | None,
        typer.Option(help="NAME=PATH: a checkout to serve from; repeat to compare (default: .)."),
    ] = None,
    runs: Annotated[int, typer.Option(help="Server starts per tree (ABBA order).")] = 3,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (<dir>/test-small).")
    ] = ASSET_DIR,
    report_dir: Annotated[
        Path, typer.Option(help="Each invocation's server logs and data, kept.")
    ] = Path(".loraplex-bench/front"),
) -> None:
    """The HTTP process of `loraplex serve` (engine process): RSS, torch mapped, start to ready."""
    from loraplex.bench.front.bench import FrontBenchConfig, run_front_bench

    with bad_parameter():
        trees = tuple(_tree(value) for value in (tree or ["here=."]))
        config = FrontBenchConfig(trees, report_dir, asset_dir=asset_dir, runs=runs)
    typer.echo(json.dumps(run_front_bench(config)))


def _tree(value: str) -> Tree:
    from loraplex.bench.front.bench import Tree

    name, sep, path = value.partition("=")
    if not sep or not name:
        raise ValueError(f"tree {value!r} is invalid; expected NAME=PATH")
    return Tree(name, Path(path).resolve())
