"""``loraplex bench cache`` (load latency per tier, trace replays, or the cost of holding many
copies) and ``loraplex bench residency`` (eviction policies side by side, simulated time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.assets import check_preset
from loraplex.cli.bench.options import (
    ASSET_DIR,
    REPORT_DIR,
    bad_parameter,
    report_folder,
    write_report,
)
from loraplex.cli.given import given

# Options of one mode of `bench cache` only: given in the other mode they would be ignored.
_CACHE_ONLY = ("presets", "reps", "max_adapters", "no_peft", "duration_s", "report_to")
_SCALE_ONLY = ("quick", "sizes")


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
        REPORT_DIR, "--report-dir", help="where cache-run.md and cache.png go; '' to skip"
    ),
    scale: bool = typer.Option(
        False, "--scale", help="instead: costs at 100, 1,000 and 10,000 cached copies"
    ),
    quick: bool = typer.Option(False, "--quick", help="with --scale: 100 and 1,000 copies only"),
    sizes: str = typer.Option("", help="with --scale: copy counts, comma-separated"),
    asset_dir: Annotated[
        Path, typer.Option(help="demo assets cache (<dir>/bench-PRESET; --scale: <dir>/test-small)")
    ] = ASSET_DIR,
) -> None:
    """Adapter cache: per-tier load latency vs raw/PEFT, and lru vs cost_aware trace replays
    (or, with --scale, what the cache costs as a function of how many copies it holds)."""
    import torch

    named = [name for name in (_CACHE_ONLY if scale else _SCALE_ONLY) if given(ctx, name)]
    if named:
        mode = "with --scale" if scale else "without --scale"
        raise typer.BadParameter(f"{', '.join(named)} cannot be used {mode}")
    if scale:
        torch.set_num_threads(1)
        typer.echo(json.dumps(_scale_result(quick, sizes, seed, asset_dir)))
        return
    from loraplex.bench.cache.bench import CacheBenchConfig, run_cache_bench
    from loraplex.bench.cache.report import cache_markdown, cache_plot

    chosen = tuple(p for p in presets.split(",") if p)
    for preset in chosen:  # NOTE: an unknown one raised a traceback once its turn came
        check_preset(preset, "--presets")
    torch.set_num_threads(1)
    config = CacheBenchConfig(
        presets=chosen,
        reps=reps,
        max_adapters=max_adapters,
        peft=not no_peft,
        duration_s=duration_s,
        seed=seed,
        asset_dir=asset_dir,
    )
    result = run_cache_bench(config)
    out = report_folder(report_to)
    if out is not None:
        cache_plot(result, out / "cache.png")
        write_report(out, "cache", "Cache benchmark", cache_markdown(result, "cache.png"))
    if not as_json:
        typer.echo(f"report: {Path(report_to)}/cache-run.md", err=True)
    # the latencies beside the ratios: each ratio's numerator and denominator can be read back
    typer.echo(json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics", "latency")}))


def _scale_result(quick: bool, sizes: str, seed: int, asset_dir: Path) -> dict[str, object]:
    from loraplex.bench.cache.scale import ScaleBenchConfig, run_scale_bench

    with bad_parameter():
        if sizes:
            counts = tuple(int(n) for n in sizes.split(",") if n)
        else:
            counts = (100, 1000) if quick else (100, 1000, 10_000)
        loads, window_s = (8, 2.0) if quick else (16, 5.0)
        config = ScaleBenchConfig(
            sizes=counts, loads=loads, idle_window_s=window_s, seed=seed, asset_dir=asset_dir
        )
    result = run_scale_bench(config)
    return {k: result[k] for k in ("name", "config", "seed", "metrics", "per_size")}


def residency(
    *,
    as_json: bool = typer.Option(False, "--json", help="print only the JSON line"),
    policies: str = typer.Option(
        "lru,lru_priority,cost_aware,admit_gdsf,tiered_gdsf,tiered_gdsf_fetch",
        help="eviction policies, comma-separated",
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
        REPORT_DIR, "--report-dir", help="where residency-run.md and PNGs go; '' to skip"
    ),
    tier_floors: bool = typer.Option(
        True, help="also bound L1 and L2 reloads (an LP per trace and seed: slower)"
    ),
    tenant_tier_share: float = typer.Option(
        1.0, help="every tier's default tenant share (serve's default is 0.5); 1.0: none"
    ),
    tier_share_by_priority: bool = typer.Option(
        False,
        "--tier-share-by-priority",
        help="the shares hold only against tenants of the same or lower priority",
    ),
) -> None:
    """Eviction policies side by side on the cache replays (simulated time, fixed stage
    costs): per-tier hit ratios, reloads after eviction, tenant waits, drift recovery."""
    from loraplex.bench.cache.policies import PolicyBenchConfig, run_policy_bench
    from loraplex.bench.cache.policies_report import policies_markdown, policies_plots

    with bad_parameter():
        config = PolicyBenchConfig(
            policies=tuple(p for p in policies.split(",") if p),
            repeats=repeats,
            duration_s=duration_s,
            tpot_s=tpot_s,
            rate=rate,
            traces=tuple(t for t in traces.split(",") if t),
            tier_floors=tier_floors,
            tenant_tier_share=tenant_tier_share,
            tier_share_by_priority=tier_share_by_priority,
        )
    result = run_policy_bench(config)
    out = report_folder(report_to)
    if out is not None:
        names = ("residency-hit-ratio.png", "residency-wait-cdf.png")
        policies_plots(result, out / names[0], out / names[1])
        write_report(out, "residency", "Residency policies", policies_markdown(result, names))
        if not as_json:
            typer.echo(f"report: {out}/residency-run.md", err=True)
    typer.echo(json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")}))
