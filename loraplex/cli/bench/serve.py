"""``loraplex bench serve``: the real server over HTTP, eviction and storm policies side by side,
HTTP vs in-process, and (opt-in) steady tenants with and without an attacker tenant."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loraplex.cli.bench.options import (
    ASSET_DIR,
    REPORT_DIR,
    AsJson,
    Rate,
    bad_parameter,
    logs_dir_ready,
    names,
    report_folder,
    write_report,
)

if TYPE_CHECKING:
    from loraplex.bench.serve.adversarial import AdversarialConfig
    from loraplex.bench.serve.config import ServeBenchConfig
    from loraplex.bench.serve.summary import RunResult


def serve(
    *,
    as_json: AsJson = False,
    duration_s: Annotated[
        float | None,
        typer.Option(help="Wall seconds of each trace replay; unset: trace-requests / rate."),
    ] = None,
    rate: Rate = None,
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
    attacker_priority: Annotated[
        str,
        typer.Option(
            help="adversarial: how the attack's own process competes for this machine's cores: "
            "normal (as the server) or idle (SCHED_IDLE: only its traffic, not its client CPU, "
            "competes; NOTE: it slowed the server on token-id-batch, see "
            "docs/benchmarks/serve.md)."
        ),
    ] = "normal",
    throughput_rounds: Annotated[int, typer.Option(help="HTTP vs in-process rounds.")] = 4,
    capacity_requests: Annotated[
        int, typer.Option(help="Requests per capacity round (HTTP, all at once).")
    ] = 128,
    hot_burst_slots: Annotated[
        str, typer.Option(help="hot-burst: GPU slot counts, comma-separated (first: headline).")
    ] = "9,12,16",
    hot_burst_candidates: Annotated[
        str,
        typer.Option(
            help="hot-burst: eviction policies measured against lru and lru_priority, "
            "comma-separated."
        ),
    ] = "cost_aware,admit_gdsf",
    hot_burst_baselines: Annotated[
        str,
        typer.Option(
            help="hot-burst: the baselines the candidates are measured against, comma-separated "
            "from lru,lru_priority."
        ),
    ] = "lru,lru_priority",
    trace_repeats: Annotated[
        int, typer.Option(help="Runs of each trace comparison, order alternating (ABBA).")
    ] = 2,
    seed: Annotated[int, typer.Option(help="Workload and adapter-weight seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the base model is <dir>/test-small).")
    ] = ASSET_DIR,
    report_dir: Annotated[
        str, typer.Option(help="Where serve-run.md and the PNGs go; '' skips them.")
    ] = REPORT_DIR,
    tenant_tier_share: Annotated[
        float | None,
        typer.Option(
            help="The trace runs' default_tenant_tier_share (in (0, 1]; 1.0: no share, the "
            "eviction policy alone); unset: the server's default."
        ),
    ] = None,
    tier_share_by_priority: Annotated[
        str,
        typer.Option(
            help="The trace runs' tier_share_by_priority (the tier shares hold only against "
            "tenants of the same or lower priority): off, on (the bare flag of before), or both "
            "(hot-burst only: every policy and slot count with the rule off and on, ABBA over "
            "the repeats, and the on / off ratios).",
        ),
    ] = "off",
    logs_dir: Annotated[
        Path | None,
        typer.Option(
            help="A new or empty directory where each trace run keeps its server's request log "
            "(the engine's stages per request) and the client's records; unset: kept nowhere.",
            resolve_path=True,  # the servers run elsewhere: a relative path is read from here
        ),
    ] = None,
) -> None:
    """The real server over HTTP: lru / lru_priority vs cost_aware, storm vs none, HTTP vs
    in-process, and (opt-in) the steady tenants with and without an attacker tenant."""
    from loraplex.bench.serve.bench import run_serve_bench
    from loraplex.bench.serve.config import ServeBenchConfig
    from loraplex.bench.serve.report import (
        hit_ratio_plot,
        serve_json_line,
        serve_markdown,
        ttft_cdf_plot,
    )
    from loraplex.bench.serve.share_arms import SHARE_SETTINGS

    if tier_share_by_priority not in SHARE_SETTINGS:
        raise typer.BadParameter(
            f"{tier_share_by_priority!r}: expected one of {', '.join(SHARE_SETTINGS)} (the bare "
            "flag of before is now --tier-share-by-priority on)",
            param_hint="--tier-share-by-priority",
        )
    if logs_dir is not None:
        try:
            logs_dir_ready(logs_dir)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--logs-dir") from exc
    try:
        slots = tuple(int(n) for n in hot_burst_slots.split(",") if n.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"hot-burst-slots {hot_burst_slots!r}: {exc}") from exc
    with bad_parameter():
        config = ServeBenchConfig(
            duration_s=duration_s,
            rate=rate,
            load=load,
            trace_requests=trace_requests,
            num_adapters=num_adapters,
            throughput_requests=throughput_requests,
            throughput_rounds=throughput_rounds,
            capacity_requests=capacity_requests,
            hot_burst_slots=slots,
            hot_burst_candidates=tuple(c.strip() for c in hot_burst_candidates.split(",")),
            hot_burst_baselines=tuple(c.strip() for c in hot_burst_baselines.split(",")),
            trace_repeats=trace_repeats,
            seed=seed,
            asset_dir=asset_dir,
            logs_dir=logs_dir,
            tenant_tier_share=tenant_tier_share,
            tier_share_by_priority=tier_share_by_priority,
            scenarios=tuple(s for s in scenarios.split(",") if s),
            adversarial=_adversarial_config(
                attack_rate,
                adversarial_rounds,
                attack_kinds,
                flood_sockets=flood_sockets,
                hang_s=hang_s,
                priority=attacker_priority,
            ),
        )
    result = run_serve_bench(config)
    out = report_folder(report_dir)
    if out is not None:
        ttft_cdf_plot(result["runs"], out / "serve-ttft-cdf.png")
        hit_ratio_plot(result["runs"], out / "serve-hit-ratio.png")
        drawn = _tenant_cdfs(result["runs"], config, out)
        markdown = serve_markdown(
            result, "serve-ttft-cdf.png", "serve-hit-ratio.png", drawn.pop("", None), drawn
        )
        write_report(out, "serve", "Serve benchmark", markdown)
        if not as_json:
            typer.echo(f"report: {report_dir}/serve-run.md", err=True)
    typer.echo(serve_json_line(result))


def _tenant_cdfs(runs: list[RunResult], config: ServeBenchConfig, out: Path) -> dict[str, str]:
    """Draws hot-burst's TTFT CDF per tenant, one per share arm under ``both``: arm -> PNG
    name of each drawn ("" for the plain runs)."""
    from loraplex.bench.serve.report import hot_burst_tenant_cdf_plot
    from loraplex.bench.serve.share_arms import ARMS, arm_runs

    arms = ARMS if config.tier_share_by_priority == "both" else ("",)
    pngs = {arm: f"serve-ttft-cdf-tenant{arm and '-by-priority-'}{arm}.png" for arm in arms}
    return {
        arm: png
        for arm, png in pngs.items()
        if hot_burst_tenant_cdf_plot(
            arm_runs(runs, arm) if arm else runs,
            config.hot_burst_slots,
            config.hot_burst_candidates,
            out / png,
            config.hot_burst_baselines,
        )
    }


def _adversarial_config(
    attack_rate: float, rounds: int, kinds: str, *, flood_sockets: int, hang_s: float, priority: str
) -> AdversarialConfig:
    from loraplex.bench.serve.adversarial import ATTACK_KINDS, AdversarialConfig

    return AdversarialConfig(
        attack_rate=attack_rate,
        rounds=rounds,
        attack_kinds=names(kinds) or ATTACK_KINDS,
        flood_sockets=flood_sockets,
        hang_s=hang_s,
        attacker_priority=priority,
    )
