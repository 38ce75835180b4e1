"""``loraplex sim run`` and ``loraplex sim scale``: the simulator (docs/simulator.md).

``run`` takes a JSONL trace (``--trace``, e.g. a server's request log) or a named
scenario (``--workload``, generated here: the simulator itself never imports ``bench``), a
cost-model file, and the deployment's settings; it prints the run's figures (``--json``: one
JSON line). Every flag is a ``SimConfig`` field or a scenario parameter; a value either refuses
is reported against its flag.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loraplex.cli.figures import figure, named_figures, ttft_text
from loraplex.cli.given import given
from loraplex.cli.router_pairs import number_pairs, router_table
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.residency.policy import DEFAULT_POLICY as DEFAULT_EVICTION
from loraplex.router import DEFAULT_POLICY as DEFAULT_ROUTING
from loraplex.sim.trace import TraceRecord

if TYPE_CHECKING:
    from loraplex.router.topology import TopologyConfig
    from loraplex.sim.cost_model import CostModel

sim_app = typer.Typer(help="The trace-driven simulator (docs/simulator.md).", no_args_is_help=True)
Opt = typer.Option


def register(app: typer.Typer) -> None:
    from loraplex.cli.sim_calibrate import register_calibrate

    register_calibrate(sim_app)
    app.add_typer(sim_app, name="sim")


def workload_trace(name: str, seed: int, duration_s: float, rate: float) -> list[TraceRecord]:
    """A named scenario (``bench/workloads.py``) as simulator trace records (each adapter's
    rank carried along)."""
    from loraplex.bench.workloads import ScenarioParams, generate

    workload = generate(name, seed, ScenarioParams(duration_s=duration_s, rate=rate))
    ranks = {(a.tenant, a.name): a.rank for a in workload.adapters}
    return [
        TraceRecord(
            r.t_s,
            r.tenant,
            r.adapter,
            r.prompt_tokens,
            r.output_tokens,
            rank=ranks[(r.tenant, r.adapter)],
        )
        for r in workload.requests
    ]


def tenant_settings(pairs: list[str]) -> dict[str, TenantSettings]:
    """``TENANT=CLASS`` pairs as the settings a tenant of that priority class gets."""
    settings = {}
    for pair in pairs:
        tenant, sep, priority = pair.partition("=")
        if not sep or not tenant:
            raise ValueError(f"{pair!r} is invalid; expected TENANT=high|normal|batch")
        settings[tenant] = TenantSettings.for_priority(priority)
    return settings


def topology_config(on: bool, pairs: list[str]) -> TopologyConfig | None:
    """``--topology`` with its ``--topology-set KEY=NUMBER`` pairs (None: off)."""
    from loraplex.router.topology import TopologyConfig

    if pairs and not on:
        raise ValueError(f"{pairs[0]!r} is set without --topology; expected both or neither")
    if not on:
        return None
    keys = [f.name for f in fields(TopologyConfig)]
    return TopologyConfig(**number_pairs(pairs, TopologyConfig, keys))  # type: ignore[arg-type]


def _fail(flag: str, error: Exception) -> typer.Exit:
    typer.echo(f"error: {flag}: {error}", err=True)
    return typer.Exit(2)


@sim_app.command("run")
def run_command(
    ctx: typer.Context,
    *,
    cost_model: Annotated[Path, Opt(help="Cost-model file (schema loraplex-sim-cost/1).")],
    trace: Annotated[Path | None, Opt(help="JSONL trace (or a server's request log).")] = None,
    workload: Annotated[
        str | None,
        Opt(
            help="A named scenario: hot-burst, hot-one, zipf-longtail, drift, cold-storm, uniform."
        ),
    ] = None,
    seed: Annotated[int, Opt(help="Scenario seed and the router's random choices.")] = 0,
    duration_s: Annotated[float, Opt(help="Scenario length, s (with --workload).")] = 60.0,
    rate: Annotated[float, Opt(help="Scenario requests per second (with --workload).")] = 20.0,
    replicas: Annotated[int, Opt(help="Engine replicas (above 1: routed).")] = 1,
    routing_policy: Annotated[str, Opt(help="Router policy name.")] = DEFAULT_ROUTING,
    eviction_policy: Annotated[str, Opt(help="Adapter eviction policy name.")] = DEFAULT_EVICTION,
    max_loras: Annotated[int, Opt(help="GPU slots per replica.")] = 8,
    cpu_adapter_bytes: Annotated[int, Opt(help="L1 budget per replica, bytes.")] = 1 << 30,
    disk_cache_bytes: Annotated[int, Opt(help="L2 budget per replica, bytes.")] = 8 << 30,
    bytes_per_rank: Annotated[int, Opt(help="An adapter's bytes per unit of rank.")] = 65536,
    max_lora_rank: Annotated[
        int, Opt(help="Largest adapter rank, a slot's rank (serve's max_lora_rank).")
    ] = 64,
    max_num_seqs: Annotated[int, Opt(help="Sequences decoding at once.")] = 32,
    max_model_len: Annotated[int, Opt(help="Prompt + output tokens of one sequence.")] = 512,
    num_kv_blocks: Annotated[int, Opt(help="KV blocks per replica (16 tokens each).")] = 1024,
    default_tenant_tier_share: Annotated[
        float, Opt(help="Share of each tier a tenant keeps against others (free room is borrowed).")
    ] = 0.5,
    auto_warm: Annotated[bool, Opt(help="Automatic warm promotion from request rates.")] = True,
    auto_warm_interval_s: Annotated[float, Opt(help="Seconds between rebalances.")] = 5.0,
    max_auto_gpu_slots: Annotated[
        int | None, Opt(help="Slots automatic promotion may pin (default: a quarter).")
    ] = None,
    tenant_priority: Annotated[
        list[str] | None, Opt(help="TENANT=high|normal|batch (repeatable).")
    ] = None,
    topology: Annotated[
        bool,
        Opt(
            "--topology",
            help="A fleet topology, as the fleet's topology table: a replica dedicated to a "
            "revision of a replica's worth of demand, run merged (TopologyConfig's defaults).",
        ),
    ] = False,
    topology_set: Annotated[
        list[str] | None,
        Opt(help="KEY=NUMBER: a TopologyConfig key of --topology (repeatable)."),
    ] = None,
    router: Annotated[
        list[str] | None,
        Opt(
            "--router",
            help="KEY=NUMBER: a key of the fleet's router table, a RouterConfig override such "
            "as max_queued (repeatable; refused as the fleet refuses it).",
        ),
    ] = None,
    as_json: Annotated[bool, Opt("--json", help="One JSON line.")] = False,
) -> None:
    """Simulate a trace or a scenario on a deployment; print its figures."""
    from loraplex.sim.config import SimConfig, rank_defaults
    from loraplex.sim.run import simulate

    model = _cost_model(cost_model)
    _refuse_scenario_flags_on_a_trace(ctx, trace)
    records = _records(trace, workload, seed, duration_s, rate)
    try:
        tenants = tenant_settings(tenant_priority or [])
    except ValueError as e:
        raise _fail("--tenant-priority", e) from e
    try:
        fleet_topology = topology_config(topology, topology_set or [])
    except ValueError as e:
        raise _fail("--topology-set", e) from e
    try:
        router_overrides = router_table(routing_policy, router or [])
    except ValueError as e:
        raise _fail("--router", e) from e
    settings: dict[str, Any] = {
        "tenants": tenants,
        "replicas": replicas,
        "routing_policy": routing_policy,
        "eviction_policy": eviction_policy,
        "max_loras": max_loras,
        "cpu_adapter_bytes": cpu_adapter_bytes,
        "disk_cache_bytes": disk_cache_bytes,
        "bytes_per_rank": bytes_per_rank,
        "max_lora_rank": max_lora_rank,
        **rank_defaults(max_lora_rank),
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "num_kv_blocks": num_kv_blocks,
        "default_tenant_tier_share": default_tenant_tier_share,
        "auto_warm": auto_warm,
        "auto_warm_interval_s": auto_warm_interval_s,
        "max_auto_gpu_slots": max_auto_gpu_slots,
        "seed": seed,
        "topology": fleet_topology,
        "router": router_overrides,
    }
    try:
        config = SimConfig(**settings)
    except ValueError as e:
        raise _fail(_flag_of(e, settings), e) from e
    try:
        result = simulate(records, config, model)
    except ValueError as e:
        raise _fail("--trace" if trace is not None else "--workload", e) from e
    body = {"name": "sim", "source": str(trace or workload), **result.to_dict()}
    if as_json:
        typer.echo(json.dumps(body, sort_keys=True, allow_nan=False))
    else:
        typer.echo(summary(result.metrics))


def _cost_model(path: Path) -> CostModel:
    from loraplex.sim import cost_model as costs

    try:
        return costs.load(path)
    except (OSError, ValueError) as e:
        raise _fail("--cost-model", e) from e


def _refuse_scenario_flags_on_a_trace(ctx: typer.Context, trace: Path | None) -> None:
    """A trace is replayed at its own times: a scenario's length or rate given beside it
    would be read by nothing."""
    if trace is None:
        return
    for name in ("duration_s", "rate"):
        if given(ctx, name):
            flag = f"--{name.replace('_', '-')}"
            raise _fail(flag, ValueError("is a scenario's (--workload); a --trace keeps its times"))


def _records(
    trace: Path | None, workload: str | None, seed: int, duration_s: float, rate: float
) -> list[TraceRecord]:
    """The trace file's records, or the scenario's; exactly one of the two."""
    from loraplex.bench.workloads import ScenarioParams
    from loraplex.sim.trace import MAX_T_S, nonempty, read_trace

    if (trace is None) == (workload is None):
        raise _fail("--trace/--workload", ValueError("give exactly one of them"))
    if trace is not None:
        try:
            return nonempty(read_trace(trace), trace)
        except (OSError, ValueError) as e:
            raise _fail("--trace", e) from e
    scenario = {"duration_s": duration_s, "rate": rate}
    try:  # checked here so that a bad value names its own flag
        ScenarioParams(duration_s=duration_s, rate=rate)
    except ValueError as e:
        raise _fail(_flag_of(e, scenario), e) from e
    if duration_s > MAX_T_S:  # its arrivals would be past what a trace may hold
        raise _fail(
            "--duration-s", ValueError(f"{duration_s:g} is invalid; expected <= {MAX_T_S:g}")
        )
    try:
        return workload_trace(str(workload), seed, duration_s, rate)
    except ValueError as e:
        raise _fail("--workload", e) from e


def summary(m: dict[str, Any]) -> str:
    """The run's main figures as a few lines of text (``--json`` gives them all)."""
    refused = m["refused"]  # refused at arrival, in no TTFT (docs/simulator.md)
    lines = [
        f"requests {m['requests']}  completed {m['completed']} "
        f"(ratio {figure(m['completed_ratio'], '.4g')})"
        + (f"  refused at arrival {named_figures(refused)}" if refused else ""),
        "  ".join(
            ttft_text(m[key], label)
            for key, label in (
                ("ttft_ms", "ttft"),
                ("ttft_ms_warm", "warm"),
                ("ttft_ms_cold", "cold"),
            )
        ),
        f"hit ratio {named_figures(m['hit_ratio'], '.3g')}",
        # NOTE: read "from the store 76" beside "cold loads 98": store_loads counts acquires
        # (several wait on one load; that run made 48 loads from the store), so it read as loads.
        f"cold loads {m['l0_loads']} ({figure(m['cold_loads_per_1k_requests'], '.1f')} per 1k "
        f"requests)  acquires that reached the store {m['store_loads']}",
        f"throughput {figure(m['throughput_tokens_per_s'], '.1f')} tokens/s",
    ]
    if "decisions" in m:
        lines.append(
            f"decisions {named_figures(m['decisions']) or 'none'}  "
            f"imbalance {figure(m['imbalance'], '.3g')}"
        )
    return "\n".join(lines)


@sim_app.command("scale")
def scale_command(
    *,
    cost_model: Annotated[Path, Opt(help="Cost-model file (schema loraplex-sim-cost/1).")],
    requests: Annotated[int, Opt(help="Requests in the synthetic trace.")] = 1_000_000,
    adapters: Annotated[int, Opt(help="Adapters (zipf 1.0).")] = 10_000,
    replicas: Annotated[int, Opt(help="Engine replicas.")] = 64,
    rate_per_replica: Annotated[float, Opt(help="Arrivals per second per replica.")] = 20.0,
    seed: Annotated[int, Opt(help="Trace seed and the router's random choices.")] = 0,
    as_json: Annotated[bool, Opt("--json", help="One JSON line.")] = False,
) -> None:
    """Time one simulation of a synthetic trace; report wall seconds and peak RSS."""
    from loraplex.sim.scale import scale_run
    from loraplex.sim.trace import MAX_T_S

    model = _cost_model(cost_model)
    # NOTE: each checked here, so a bad one names its own flag: all four were named at once,
    # and --replicas -2 read as "rate -40.0 is invalid"
    for flag, value in (
        ("--requests", requests),
        ("--adapters", adapters),
        ("--replicas", replicas),
    ):
        if value < 1:
            raise _fail(flag, ValueError(f"{value} is invalid; expected >= 1"))
    if not (math.isfinite(rate_per_replica) and rate_per_replica > 0):
        raise _fail(
            "--rate-per-replica", ValueError(f"{rate_per_replica} is invalid; expected > 0")
        )
    span_s = requests / (rate_per_replica * replicas)  # the trace's expected last arrival
    if span_s > MAX_T_S:  # NOTE: else refused by the trace's t_s check, naming all four flags
        raise _fail(
            "--rate-per-replica",
            ValueError(
                f"{rate_per_replica:g} is invalid: {requests} requests over {replicas} replicas "
                f"would arrive over about {span_s:.3g} s; expected a trace of at most "
                f"{MAX_T_S:g} s (a higher rate, or fewer requests)"
            ),
        )
    try:
        line = scale_run(
            requests, adapters, replicas, model, rate_per_replica=rate_per_replica, seed=seed
        )
    except ValueError as e:
        raise _fail("--requests/--adapters/--replicas/--rate-per-replica", e) from e
    body = {"name": "sim-scale", "seed": seed, "metrics": line}
    typer.echo(json.dumps(body, sort_keys=True) if as_json else json.dumps(line, indent=2))


def _flag_of(error: ValueError, settings: dict[str, Any]) -> str:
    """The flag whose SimConfig field the error names (the message starts with it), with the
    flags of the other fields it names (``--num-kv-blocks/--max-model-len``)."""
    words = str(error).replace(",", " ").split()
    if not words or words[0] not in settings:
        return "--options"
    named = dict.fromkeys(w for w in words if w in settings)  # in order, the first one first
    return "/".join(f"--{field.replace('_', '-')}" for field in named)
