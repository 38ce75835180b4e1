"""``loraplex bench fleet``: routing policies side by side on a real fleet (Ray Serve)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loraplex.cli.bench.options import (
    ASSET_DIR,
    AsJson,
    Rate,
    RequestTimeoutS,
    bad_parameter,
    names,
)

if TYPE_CHECKING:
    from loraplex.bench.fleet.config import FleetBenchConfig

HOT_ONE = "hot-one"  # the trace whose rate --hot-load sets


def fleet(
    *,
    as_json: AsJson = False,
    quick: Annotated[
        bool,
        typer.Option(
            help="Smoke run: zipf-longtail, pow2 vs affinity_until_saturated, 16 warm-up and 32 "
            "measured requests at 3 req/s, one repeat (options given explicitly still apply)."
        ),
    ] = False,
    traces: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated from zipf-longtail,hot-burst,hot-one (default all three)."
        ),
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(help="Routing policies, comma-separated, in forward run order (default all)."),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            help="Runs of each policy per trace, order alternating; medians over them (3)."
        ),
    ] = None,
    replicas: Annotated[
        int | None, typer.Option(help="Engine replicas per fleet (3; --topology: 2).")
    ] = None,
    max_loras: Annotated[
        int | None, typer.Option(help="GPU adapter slots per replica (3; --topology: 16).")
    ] = None,
    topology: Annotated[
        bool,
        typer.Option(
            "--topology",
            help="Issue 28's fleet topology instead of routing policies: every replica "
            "unmerged vs every replica auto with [fleet] topology on, on skewed80 and "
            "uniform16 (docs/modes.md, 'Topology, measured'); exits 1 when a greedy probe "
            "differs between runs.",
        ),
    ] = False,
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
    rate: Rate = None,
    load: Annotated[
        float | None,
        typer.Option(
            help="Trace rate as a fraction of the measured capacity (0.5; not with a rate)."
        ),
    ] = None,
    hot_load: Annotated[
        float | None,
        typer.Option(
            help="hot-one: its hot revision's demand in one replica's capacity (measured "
            "capacity / replicas; 1.5; not with a rate)."
        ),
    ] = None,
    request_timeout_s: RequestTimeoutS = 30.0,
    seed: Annotated[int, typer.Option(help="Workload, prompt, adapter and router seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the base model is <dir>/test-small).")
    ] = ASSET_DIR,
) -> None:
    """Routing policies side by side on a real fleet (Ray Serve, small slot pools): L0 hit
    ratio, P99 TTFT, cold loads and decisions per policy on zipf-longtail, hot-burst and
    hot-one (one revision asking more than a replica serves), medians over the repeats."""
    import os

    if topology:
        _topology(
            as_json=as_json,
            quick=quick,
            traces=names(traces),
            policies=policies,
            hot_load=hot_load,
            values={
                "repeats": repeats,
                "replicas": replicas,
                "max_loras": max_loras,
                "torch_threads": threads,
                "trace_requests": trace_requests,
                "warmup_requests": warmup_requests,
                "rate": rate,
                "load": load,
                "request_timeout_s": request_timeout_s,
                "seed": seed,
                "asset_dir": asset_dir,
            },
        )
        return
    replicas = 3 if replicas is None else replicas
    max_loras = 3 if max_loras is None else max_loras
    from loraplex.bench.fleet.bench import QUICK_SETTINGS, FleetBenchConfig, run_fleet_bench
    from loraplex.bench.fleet.report import fleet_json_line
    from loraplex.bench.fleet.table import fleet_table
    from loraplex.cli.fleet import default_threads_per_replica

    given: dict[str, Any] = {
        "traces": names(traces),
        "policies": names(policies),
        "repeats": repeats,
        "trace_requests": trace_requests,
        "warmup_requests": warmup_requests,
        "rate": rate,
        "load": load,
        "hot_load": hot_load,
    }
    values = {k: v for k, v in given.items() if v is not None}
    if quick:
        values = {**QUICK_SETTINGS, **values}
    if threads is None:
        threads = default_threads_per_replica(max(1, replicas), os.cpu_count())
    with bad_parameter():
        config = FleetBenchConfig(
            **values,
            replicas=replicas,
            max_loras=max_loras,
            torch_threads=threads,
            request_timeout_s=request_timeout_s,
            seed=seed,
            asset_dir=asset_dir,
        )
    _refuse_unread_rates(config, load, hot_load)
    result = run_fleet_bench(config)
    if not as_json:
        typer.echo(fleet_table(result))
    typer.echo(fleet_json_line(result))


def _topology(
    *,
    as_json: bool,
    quick: bool,
    traces: tuple[str, ...] | None,
    policies: str | None,
    hot_load: float | None,
    values: dict[str, Any],
) -> None:
    """``--topology``: the two sides on the topology traces (``bench/fleet/topology/``);
    options it would not read are refused by name."""
    import os

    from loraplex.bench.fleet.report import fleet_json_line
    from loraplex.bench.fleet.topology import (
        TopologyBenchConfig,
        run_topology_bench,
        topology_table,
    )
    from loraplex.cli.fleet import default_threads_per_replica

    for flag, unread in (("--quick", quick), ("--policies", policies), ("--hot-load", hot_load)):
        if unread:
            raise typer.BadParameter(
                f"{flag} is not read with --topology (its sides and traces are fixed)"
            )
    if values["load"] is not None and values["rate"] is not None:
        raise typer.BadParameter("--load sets a rate from the capacity; not with --rate")
    given = {k: v for k, v in values.items() if v is not None}
    if traces is not None:
        given["traces"] = traces
    if given.get("torch_threads") is None:
        replicas = given.get("replicas", TopologyBenchConfig.replicas)
        given["torch_threads"] = default_threads_per_replica(max(1, replicas), os.cpu_count())
    with bad_parameter():
        config = TopologyBenchConfig(**given)
    result = run_topology_bench(config)
    if not as_json:
        typer.echo(topology_table(result))
    typer.echo(fleet_json_line(result))
    mismatches = result["metrics"]["probes"]["mismatches"]
    if mismatches:
        typer.echo(f"bench fleet --topology failed: probes differ: {mismatches}", err=True)
        raise typer.Exit(1)


def _refuse_unread_rates(
    config: FleetBenchConfig, load: float | None, hot_load: float | None
) -> None:
    """``--load`` and ``--hot-load`` set trace rates from the measured capacity: refused where
    no trace would read them (a fixed rate, or no trace of theirs)."""
    for flag, value in (("--load", load), ("--hot-load", hot_load)):
        if value is not None and config.rate is not None:
            raise typer.BadParameter(
                f"{flag} sets a rate from the capacity; not with --rate/--quick"
            )
    if hot_load is not None and HOT_ONE not in config.traces:
        raise typer.BadParameter("--hot-load sets hot-one's rate; hot-one is not among --traces")
    if load is not None and set(config.traces) <= {HOT_ONE}:
        raise typer.BadParameter("--load sets the rate of traces other than hot-one; none runs")
