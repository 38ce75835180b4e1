"""``loraplex plan``: the capacity planner (docs/simulator.md, "Calibration, validation, planner").

Sweeps simulated deployments of one trace on one hardware profile and prints the cheapest that
meets the objectives, with its cost per correct request, the runner-up and why it lost.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from loraplex.cli.figures import figure, ttft_text

_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]iB|B)?\s*$")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)


def byte_sizes(text: str, option: str) -> tuple[int, ...]:
    """``64MiB,1GiB`` -> bytes; anything else is a BadParameter naming the option."""
    out = []
    for part in text.split(","):
        match = _SIZE.match(part)
        if match is None:
            raise typer.BadParameter(
                f"{part.strip()!r} is no size (e.g. 256MiB)", param_hint=option
            )
        out.append(int(match.group(1)) * _UNITS[match.group(2) or ""])
    return tuple(out)


def ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError as exc:
        raise typer.BadParameter(
            f"{text!r} is no comma-separated integers", param_hint=option
        ) from exc


def swept(values: tuple[int, ...], option: str, minimum: int = 1) -> tuple[int, ...]:
    """A swept axis's values, each at least ``minimum`` and none twice. NOTE: a zero, a negative
    or a repeated value was refused as ``Candidate.cpu_adapter_bytes 0`` or
    ``SweepSpace.replicas``, names no flag has."""
    text = ",".join(str(v) for v in values)
    if min(values) < minimum or len(set(values)) != len(values):
        raise typer.BadParameter(
            f"{text!r} is invalid; expected distinct values >= {minimum}", param_hint=option
        )
    return values


def names(text: str, known: tuple[str, ...], option: str) -> tuple[str, ...]:
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise typer.BadParameter(
            f"{unknown} unknown; expected from {list(known)}", param_hint=option
        )
    return chosen


def plan_command(
    *,
    trace: Annotated[Path, typer.Option(help="JSONL trace (t_s, tenant, adapter, ...).")],
    slo: Annotated[
        str, typer.Option(help="Objectives, e.g. 'ttft_p99<=500ms,completed_ratio>=0.99'.")
    ],
    hardware: Annotated[str, typer.Option(help="Hardware profile name or cost-model file.")],
    replicas: Annotated[str, typer.Option(help="Replica counts swept.")] = "1,2,3,4",
    max_loras: Annotated[str, typer.Option(help="GPU slots per replica swept.")] = "4,8,16",
    cpu_bytes: Annotated[str, typer.Option(help="L1 budgets per replica swept.")] = "64MiB,256MiB",
    disk_bytes: Annotated[str, typer.Option(help="L2 budgets per replica swept.")] = "1GiB",
    eviction: Annotated[str, typer.Option(help="Eviction policies swept.")] = "lru,cost_aware",
    routing: Annotated[str, typer.Option(help="Routing policies swept (replicas > 1).")] = (
        "pow2,affinity_until_saturated"
    ),
    merged_replicas: Annotated[
        str, typer.Option(help="Merged replicas swept (0 only today).")
    ] = "0",
    bytes_per_rank: Annotated[
        int | None, typer.Option(help="Adapter bytes per unit of rank (default: the simulator's).")
    ] = None,
    max_lora_rank: Annotated[
        int, typer.Option(help="Largest adapter rank, a slot's rank (serve's max_lora_rank).")
    ] = 64,
    usd_per_hour: Annotated[
        float | None, typer.Option(help="Price of one machine-hour (default: the profile's).")
    ] = None,
    price_source: Annotated[str, typer.Option(help="Where --usd-per-hour comes from.")] = "",
    cost_tolerance: Annotated[
        float,
        typer.Option(
            help="Costs within this fraction of the cheapest are ties; the smallest footprint "
            "among them wins (0: exact ties only)."
        ),
    ] = 0.0,
    router: Annotated[
        list[str] | None,
        typer.Option(
            "--router",
            help="KEY=NUMBER: a key of the fleet's router table (a RouterConfig override such as "
            "max_queued) for every routed candidate; each swept routing policy must read it "
            "(repeatable).",
        ),
    ] = None,
    plots_dir: Annotated[str, typer.Option(help="Where the PNG plots go; '' skips them.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
) -> None:
    """The cheapest simulated configuration meeting --slo on --trace, priced per correct request."""
    from loraplex.plan.bind import simulator
    from loraplex.plan.objectives import parse_objectives
    from loraplex.plan.plots import write_plots
    from loraplex.plan.select import plan, plan_record
    from loraplex.sim.call import read_trace
    from loraplex.sim.config import SimConfig, rank_defaults
    from loraplex.sim.profiles import load_profile
    from loraplex.sim.trace import nonempty

    if bytes_per_rank is not None and bytes_per_rank < 1:
        raise typer.BadParameter(
            f"{bytes_per_rank} is invalid; expected >= 1", param_hint="--bytes-per-rank"
        )
    # NOTE: each refusal names its flag (param_hint); one ``Invalid value:`` for them all named
    # none where the message did not (a missing trace file, a negative --usd-per-hour)
    with _refused("--slo"):
        objectives = parse_objectives(slo)
    with _refused("--hardware"):
        cost_model = load_profile(hardware)
    with _refused("--usd-per-hour"):
        price = machine_price(hardware, cost_model.hardware, usd_per_hour, price_source)
    with _refused("--merged-replicas"):
        candidates = _candidates(
            replicas=replicas, max_loras=max_loras, cpu_bytes=cpu_bytes, disk_bytes=disk_bytes,
            eviction=eviction, routing=routing, merged_replicas=merged_replicas,
        )  # fmt: skip
    with _refused("--trace"):
        records = nonempty(read_trace(trace), trace)
    if not (math.isfinite(cost_tolerance) and cost_tolerance >= 0):
        raise typer.BadParameter(
            f"--cost-tolerance {cost_tolerance} is invalid; expected >= 0",
            param_hint="--cost-tolerance",
        )
    base: dict[str, Any] = {} if bytes_per_rank is None else {"bytes_per_rank": bytes_per_rank}
    with _refused("--max-lora-rank"):
        ranks = {"max_lora_rank": max_lora_rank, **rank_defaults(max_lora_rank)}
        base.update(ranks, max_lora_rank=SimConfig(**ranks).max_lora_rank)  # checked here
    over = [r for r in records if r.rank is not None and r.rank > max_lora_rank]
    if over:  # NOTE: each candidate's simulation raised it, a traceback (newop4)
        raise typer.BadParameter(
            f"{trace}: rank {over[0].rank} of adapter {over[0].tenant}/{over[0].adapter} is "
            f"above --max-lora-rank {max_lora_rank}; give the served max_lora_rank",
            param_hint="--trace",
        )
    with _refused("--router"):
        table = swept_router(router or [], {c.routing_policy for c in candidates})
    if table:
        base["router"] = table
    simulate = simulator(records, cost_model, base)
    result = plan(candidates, simulate, objectives, price, cost_tolerance)
    record = {
        "name": "plan",
        "trace": str(trace),
        "hardware": cost_model.hardware,
        "slo": [o.text() for o in objectives],
        "price_usd_per_hour": price.usd_per_hour,
        "price_source": price.source,
        "cost_tolerance": cost_tolerance,
        "router": table,  # ``--router``: every routed candidate's router overrides
        **plan_record(result),
    }
    if plots_dir:
        record["plots"] = [str(p) for p in write_plots(result, Path(plots_dir))]
    if not as_json:
        typer.echo(summary(record), err=True)
    typer.echo(json.dumps(record, allow_nan=False))


def swept_router(pairs: list[str], policies: set[str]) -> dict[str, int | float]:
    """``--router`` pairs as the fleet's router table, checked against every swept routing
    policy (a key one of them does not read is refused naming that policy, as the fleet
    refuses it)."""
    from loraplex.cli.router_pairs import router_table

    table: dict[str, int | float] = {}
    for policy in sorted(policies):
        table = router_table(policy, pairs)
    return table


@contextmanager
def _refused(option: str) -> Iterator[None]:
    """A ValueError or OSError inside is a BadParameter naming ``option``."""
    try:
        yield
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def _candidates(
    *, replicas: str, max_loras: str, cpu_bytes: str, disk_bytes: str, eviction: str,
    routing: str, merged_replicas: str,
) -> list[Any]:  # fmt: skip
    """The sweep's candidates; a merged replica is refused (the simulator has none yet)."""
    from loraplex.plan.space import SweepSpace
    from loraplex.residency.policy import policy_names as eviction_names
    from loraplex.router.router import policy_names as routing_names

    space = SweepSpace(
        replicas=swept(ints(replicas, "--replicas"), "--replicas"),
        max_loras=swept(ints(max_loras, "--max-loras"), "--max-loras"),
        cpu_adapter_bytes=swept(byte_sizes(cpu_bytes, "--cpu-bytes"), "--cpu-bytes"),
        disk_cache_bytes=swept(byte_sizes(disk_bytes, "--disk-bytes"), "--disk-bytes"),
        eviction_policies=names(eviction, eviction_names(), "--eviction"),
        routing_policies=names(routing, routing_names(), "--routing"),
        merged_replicas=swept(ints(merged_replicas, "--merged-replicas"), "--merged-replicas", 0),
    )
    candidates = list(space.candidates())
    if any(c.merged_replicas for c in candidates):
        raise ValueError("--merged-replicas: the simulator does not model merged replicas yet")
    return candidates


def machine_price(name: str, hardware: str, usd_per_hour: float | None, source: str) -> Any:
    """The price: --usd-per-hour with its --price-source, else the profile's recorded one."""
    from loraplex.qualify.cost import MachinePrice
    from loraplex.sim.profiles import price_of

    if usd_per_hour is not None:
        if not source:
            raise ValueError("--usd-per-hour needs --price-source (where the price comes from)")
        if not (math.isfinite(usd_per_hour) and usd_per_hour > 0):
            raise ValueError(f"{usd_per_hour} is invalid; expected a price > 0")
        return MachinePrice(hardware, usd_per_hour, source)
    if source:
        raise ValueError("--price-source is only read with --usd-per-hour")
    recorded = price_of(hardware)
    if recorded is None:
        raise ValueError(f"no recorded price for {name!r}: give --usd-per-hour and --price-source")
    return MachinePrice(hardware, recorded[0], recorded[1])


def summary(record: dict[str, Any]) -> str:
    def line(label: str, entry: dict[str, Any] | None) -> str:
        if entry is None:
            return f"{label}: none"
        cost = entry["usd_per_correct_request"]
        shown = "undefined" if cost is None else f"{cost:.3g} USD/correct request"
        return (
            f"{label}: {entry['config']['label']}  {shown}  {ttft_text(entry['ttft_ms'] or {})}  "
            f"completed {figure(entry['completed_ratio'], '.4g')}"
        )

    if record["best"] is None:
        # NOTE: it printed "best: none", "runner-up: none" and "why the runner-up lost: None"
        lines = [
            f"best: none of the {record['candidates']} configurations met "
            f"{', '.join(record['slo'])}",
            line("cheapest rejected", record["cheapest_rejected"]),
        ]
    else:
        lines = [
            line("best", record["best"]),
            line("runner-up", record["runner_up"]),
            f"why the runner-up lost: {record['why_runner_up_lost']}",
            line("cheapest rejected", record["cheapest_rejected"]),
        ]
    if record["cheapest_rejected"] is not None:
        lines.append(f"  missed: {', '.join(record['cheapest_rejected']['violations'])}")
    return "\n".join(lines)
