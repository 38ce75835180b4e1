"""``loraplex bench modes``: merged vs unmerged vs base execution and the auto mode policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.bench.options import AsJson, Preset, Rounds, Threads, bad_parameter


def modes(
    *,
    preset: Preset = "small",
    as_json: AsJson = False,
    threads: Threads = 1,
    rounds: Rounds = 7,
    seed: Annotated[int, typer.Option(help="Seed of weights and traces.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 16,
    context_tokens: Annotated[
        int, typer.Option(help="Prompt tokens per sequence (the prefill steps' chunk).")
    ] = 64,
    plot: Annotated[
        str, typer.Option(help="Where to write the share plot (PNG); '' skips it.")
    ] = "",
    replay_requests: Annotated[
        int, typer.Option(help="Requests per request-level replay (TTFT, closed loop).")
    ] = 64,
    replay_rounds: Annotated[
        int, typer.Option(help="ABBA rounds of each replay, after a warm-up pair.")
    ] = 1,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    hot_rank: Annotated[
        int, typer.Option(help="Rank of the hot revision (8, 16, 32 or 64; same mix for the rest).")
    ] = 16,
    single_rounds: Annotated[
        int, typer.Option(help="ABBA rounds of the single-revision base/unmerged/merged trio.")
    ] = 15,
    sample_ms: Annotated[
        float, typer.Option(help="Least duration of each single-revision timed sample (ms).")
    ] = 150.0,
    single_blocks: Annotated[
        int,
        typer.Option(
            help="Blocks per single-revision sample: the variants take turns block by block, "
            "a sample is its median block (1: one block per sample)."
        ),
    ] = 9,
    base_linear_kernel: Annotated[
        str,
        typer.Option(
            help="The base linears' matmul: auto (packed for float32 on a CPU), blas, onednn "
            "or packed (float32 only); every mode runs the same one."
        ),
    ] = "auto",
) -> None:
    """Merged vs unmerged vs base execution and the auto mode policy, side by side.
    Exits 1 when a greedy output differs between modes beyond the parity rule (float32:
    any token; bfloat16/float16: anything but a near-tie, docs/modes.md)."""
    import torch

    from loraplex.bench.modes.bench import ModesBenchConfig, ProbeMismatchError, run_modes_bench
    from loraplex.bench.modes.plot import modes_plot

    torch.set_num_threads(threads)
    with bad_parameter():
        config = ModesBenchConfig(
            preset=preset,
            rounds=rounds,
            seed=seed,
            batch_size=batch_size,
            context_tokens=context_tokens,
            replay_requests=replay_requests,
            replay_rounds=replay_rounds,
            dtype=dtype,
            hot_rank=hot_rank,
            single_rounds=single_rounds,
            sample_ms=sample_ms,
            single_blocks=single_blocks,
            base_linear_kernel=base_linear_kernel,
        )
    try:
        result = run_modes_bench(config)
    except ProbeMismatchError as exc:
        typer.echo(f"bench modes failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    if plot:
        modes_plot(result, Path(plot))
    if not as_json:
        typer.echo("merged/unmerged/base decode steps; see docs/modes.md", err=True)
    typer.echo(json.dumps(result))
