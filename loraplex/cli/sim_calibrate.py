"""``loraplex sim calibrate``: measure a running server (``--url`` with ``--admin-key``, else the
data directory's ``admin-key`` file, as ``preflight`` and ``qualify`` read it) or one started
for the purpose (``--self``) and write a validated cost-model file (docs/simulator.md,
"Calibration, validation, planner"). ``register_calibrate(sim_app)`` adds it to the ``sim``
group; ``loraplex sim calibrate`` exists once that group is registered."""

from __future__ import annotations

import json
import shlex
import sys
from contextlib import AbstractContextManager
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from loraplex.cli.given import given
from loraplex.cli.locations import DataDir
from loraplex.cli.plan import ints
from loraplex.cli.preflight import _admin_key, key_file_hint, refuse_with_self
from loraplex.cli.url_option import base_url

if TYPE_CHECKING:
    from loraplex.bench.sim.calibrate_target import Target
    from loraplex.bench.sim.fit_check import BrokenFit
    from loraplex.sim.cost_model import CostModel


Report = Annotated[Path | None, typer.Option(help="Also write every sample here (JSON).")]
PrefillLengths = Annotated[str, typer.Option(help="Prompt lengths of the lone prefill requests.")]
AcceptBrokenFit = Annotated[
    bool,
    typer.Option(
        "--accept-broken-fit",
        help="Write the model even if its fit fails the check twice (said in its sources); "
        "without it such a calibration writes no model and exits 1.",
    ),
]


_FLAG_OF_FIELD = {"revision_counts": "--revisions"}  # the fields whose flag is not their name


def flag_of_field(error: ValueError, config: type) -> str | None:
    """The flag of the field of ``config`` (a dataclass) a refusal names first (``batch_sizes
    (0, 2) is invalid``: ``--batch-sizes``; ``revision_counts``: ``--revisions``); None when its
    first word is no field of it. NOTE: these were ``Invalid value:`` with the field's name
    alone, ``revision_counts`` a name no flag has."""
    words = str(error).split()
    if not words or words[0] not in {f.name for f in fields(config)}:
        return None
    return _FLAG_OF_FIELD.get(words[0], "--" + words[0].replace("_", "-"))


def register_calibrate(sim_app: typer.Typer) -> None:
    sim_app.command("calibrate")(calibrate_command)
    sim_app.command("calibrate-fleet")(calibrate_fleet_command)


def calibrate_fleet_command(
    *,
    base: Annotated[
        Path, typer.Option(help="A lone server's cost-model file (sim calibrate's output).")
    ],
    out: Annotated[Path, typer.Option(help="Cost-model file to write (JSON).")],
    replicas: Annotated[int, typer.Option(help="Engine replicas of the demo fleet.")] = 3,
    requests: Annotated[
        int, typer.Option(help="Lone requests per prompt length and adapter (and decode ones).")
    ] = 8,
    prefill_lengths: PrefillLengths = "8,16,32,64",
    in_flight: Annotated[
        str, typer.Option(help="Requests kept in flight in the contention rounds (with 1).")
    ] = "1,2,4,8",
    contention_rounds: Annotated[
        int, typer.Option(help="Rounds per in-flight count (their median throughput).")
    ] = 3,
    contention_adapters: Annotated[
        int | None,
        typer.Option(help="Adapters the contention rounds spread over (default: one per replica)."),
    ] = None,
    cold_requests: Annotated[
        int,
        typer.Option(
            help="Lone cold requests after the contention rounds, each on an adapter of its own "
            "in no replica: their loads' stage seconds (the fleet's stage counters) against the "
            "lone server's price fit fleet_load_scale (0, or 3 to 256; 0: not measured, the "
            "loads cost fleet_cpu_scale times their price)."
        ),
    ] = 12,
    report: Report = None,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (base model <dir>/test-small).")
    ] = Path(".loraplex-assets"),
    accept_broken_fit: AcceptBrokenFit = False,
) -> None:
    """Add a fleet's costs to a lone server's model: measure a local demo fleet (Ray) with lone
    warm requests through its ingress, paced as a trace sends them: the ingress-to-replica hop
    and its spread, the co-located replicas' step scale, the machine's cores; and the fleet's
    slowdown with 1, 2, 4, 8 requests in flight; and its loads from the store, by lone cold
    requests (docs/simulator.md)."""
    from loraplex.bench.sim.calibrate_fleet import FleetCalibrateConfig, calibrate_fleet
    from loraplex.bench.sim.fit_check import BrokenFit, recorded_step_fit, step_fit_faults
    from loraplex.sim.cost_model import load

    try:
        config = FleetCalibrateConfig(
            replicas=replicas,
            requests=requests,
            prefill_lengths=ints(prefill_lengths, "--prefill-lengths"),
            in_flight=ints(in_flight, "--in-flight"),
            contention_rounds=contention_rounds,
            contention_adapters=contention_adapters,
            cold_requests=cold_requests,
        )
    except ValueError as exc:
        raise typer.BadParameter(
            str(exc), param_hint=flag_of_field(exc, FleetCalibrateConfig)
        ) from exc
    try:
        base_model = load(base)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--base") from exc
    recorded = recorded_step_fit(base_model)
    faults = [] if recorded is None else step_fit_faults(recorded)
    if faults and not accept_broken_fit:
        raise typer.BadParameter(
            f"{base}'s step fit does not hold together ({'; '.join(faults)}); "
            "--accept-broken-fit uses it",
            param_hint="--base",
        )
    argv = sys.argv[1:]
    given = argv[argv.index("calibrate-fleet") + 1 :] if "calibrate-fleet" in argv else argv
    command = shlex.join(["loraplex", "sim", "calibrate-fleet", *given])
    try:
        model, measured = calibrate_fleet(
            base_model, config, asset_dir, command, accept_broken_fit=accept_broken_fit
        )
    except BrokenFit as exc:
        _refused(exc, out, report)
    _written("sim-calibrate-fleet", model, measured, out, report)


def _target(
    url: str | None, admin_key: str | None, data_dir: Path | None, own: bool, *,
    max_adapters: int, asset_dir: Path, max_loras: int, target_sets: tuple[str, ...],
    load_cpu_shared: bool,
) -> AbstractContextManager[Target]:  # fmt: skip
    from loraplex.bench.sim.calibrate_target import remote_target, self_target

    if url is not None and not own:
        return remote_target(url, _admin_key(admin_key, data_dir), max_adapters, load_cpu_shared)
    if url is not None or not own:
        raise typer.BadParameter("give exactly one of --url and --self", param_hint="--url")
    refuse_with_self(admin_key, data_dir)
    return self_target(asset_dir, (8, 16, 32, 64), 2, max_loras, 0, target_sets=target_sets)


def calibrate_command(
    ctx: typer.Context,
    *,
    out: Annotated[Path, typer.Option(help="Cost-model file to write (JSON).")],
    hardware: Annotated[str, typer.Option(help="Name of the measured hardware profile.")],
    url: Annotated[
        str | None, typer.Option(help="Base URL of the server to measure.", parser=base_url)
    ] = None,
    admin_key: Annotated[
        str | None,
        typer.Option(envvar="LORAPLEX_ADMIN_KEY", help="Its admin credential (default: data dir)."),
    ] = None,
    data_dir: DataDir = None,
    own: Annotated[
        bool, typer.Option("--self", help="Start and measure a demo-model server instead.")
    ] = False,
    max_adapters: Annotated[int, typer.Option(help="--url: adapters discovered at most.")] = 8,
    max_loras: Annotated[int, typer.Option(help="--self: the server's GPU slots.")] = 8,
    load_cpu_shared: Annotated[
        bool,
        typer.Option(
            "--load-cpu-shared",
            help="--url: the server loads adapters on its engine's CPU (--self always does).",
        ),
    ] = False,
    batch_sizes: Annotated[
        str, typer.Option(help="Decode batch sizes of the step mixes.")
    ] = "1,2,4,8",
    revisions: Annotated[str, typer.Option(help="Distinct adapters per step mix.")] = "1,2,4",
    output_tokens: Annotated[int, typer.Option(help="Decode steps per mix request (>= 3).")] = 24,
    prefill_lengths: PrefillLengths = "8,16,32,64",
    repeats: Annotated[
        int, typer.Option(help="Runs of each step mix (its sample: the runs' median).")
    ] = 3,
    report: Report = None,
    asset_dir: Annotated[
        Path, typer.Option(help="--self: demo assets cache (base model <dir>/test-small).")
    ] = Path(".loraplex-assets"),
    target_sets: Annotated[
        str | None,
        typer.Option(
            help="--self: adapters' target sets, from 'attn' (q/k/v/o) and 'all' (every "
            "linear layer); two or more price LoRA work by the adapters' bytes "
            "(default: attn,all)."
        ),
    ] = None,
    accept_broken_fit: AcceptBrokenFit = False,
) -> None:
    """Fit the simulator's cost model to a server: step time vs decode and prompt tokens,
    distinct revisions and rank mix; per-tier load costs; front and IPC overheads."""
    import httpx

    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import SELF_TARGET_SETS, TargetError
    from loraplex.bench.sim.calibration import calibrate
    from loraplex.bench.sim.fit_check import BrokenFit

    try:
        config = CalibrateConfig(
            batch_sizes=ints(batch_sizes, "--batch-sizes"),
            revision_counts=ints(revisions, "--revisions"),
            output_tokens=output_tokens,
            prefill_lengths=ints(prefill_lengths, "--prefill-lengths"),
            repeats=repeats,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag_of_field(exc, CalibrateConfig)) from exc
    if target_sets is not None and url is not None:
        raise typer.BadParameter(
            "--url measures the server's own adapters; --target-sets is for --self",
            param_hint="--target-sets",
        )
    _refuse_other_mode(ctx, url is not None)
    given_sets = "attn,all" if target_sets is None else target_sets
    sets = tuple(t.strip() for t in given_sets.split(",") if t.strip())
    if not sets or not set(sets) <= set(SELF_TARGET_SETS) or len(set(sets)) != len(sets):
        raise typer.BadParameter(
            f"--target-sets {target_sets!r} is invalid; expected distinct names from "
            f"{list(SELF_TARGET_SETS)}",
            param_hint="--target-sets",
        )
    if max_adapters < 1 or max_loras < 1:
        raise typer.BadParameter("--max-adapters and --max-loras must be >= 1")
    if not hardware.strip():
        raise typer.BadParameter(
            "--hardware must name the measured hardware", param_hint="--hardware"
        )
    argv = sys.argv[1:]
    given = argv[argv.index("calibrate") + 1 :] if "calibrate" in argv else argv
    command = shlex.join(["loraplex", "sim", "calibrate", *_redacted(given)])
    try:
        with _target(
            url,
            admin_key,
            data_dir,
            own,
            max_adapters=max_adapters,
            asset_dir=asset_dir,
            max_loras=max_loras,
            target_sets=sets,
            load_cpu_shared=load_cpu_shared,
        ) as target:
            # The --self demo server is CPU-only: its target says its loader and engine share one.
            try:
                model, measured = calibrate(
                    target, config, hardware, command, accept_broken_fit=accept_broken_fit
                )
            except BrokenFit as exc:
                _refused(exc, out, report)
    except TargetError as exc:  # NOTE: a bad --url ended in a traceback
        typer.echo(f"sim calibrate: --url {url}: {exc}", err=True)
        raise typer.Exit(2) from None
    except httpx.HTTPStatusError as exc:  # NOTE: a refused admin call ended in a traceback
        hint = key_file_hint(exc.response.status_code, admin_key, data_dir)
        typer.echo(
            f"sim calibrate: {exc.request.method} {exc.request.url.path} -> "
            f"{exc.response.status_code}{hint}",
            err=True,
        )
        raise typer.Exit(2) from None
    _written("sim-calibrate", model, measured, out, report)


_SELF_ONLY = ("max_loras", "asset_dir")  # what only --self's own server uses
_URL_ONLY = ("max_adapters",)  # what only --url's discovery uses


def _refuse_other_mode(ctx: typer.Context, remote: bool) -> None:
    """A flag of the other mode does nothing: refused by name. NOTE: --max-loras and --asset-dir
    with --url, and --max-adapters with --self, were silently ignored."""
    named = [
        f"--{name.replace('_', '-')}"
        for name in (_SELF_ONLY if remote else _URL_ONLY)
        if given(ctx, name)
    ]
    if named:
        mode, other = ("--url", "--self") if remote else ("--self", "--url")
        raise typer.BadParameter(
            f"{', '.join(named)} is for {other}; {mode} does not use it", param_hint=named[0]
        )


def _written(
    name: str, model: CostModel, measured: dict[str, Any], out: Path, report: Path | None
) -> None:
    """A calibrated model saved at ``out`` (what was measured at ``report``), and its line."""
    model.save(out)
    _report(measured, report)
    typer.echo(json.dumps({"name": name, "out": str(out), **json.loads(model.to_json())}))


def _report(measured: dict[str, Any], report: Path | None) -> None:
    if report is not None:
        report.write_text(json.dumps(measured, sort_keys=True) + "\n", encoding="utf-8")


def _refused(exc: BrokenFit, out: Path, report: Path | None) -> NoReturn:
    """A calibration whose fit failed twice: its report written (the checks in it), no model."""
    _report(exc.report, report)  # what was measured, with the checks, to look into
    typer.echo(f"error: {exc}; {out} not written (--accept-broken-fit writes it)", err=True)
    raise typer.Exit(1) from exc


def _redacted(argv: list[str]) -> list[str]:
    """argv without the admin key's value (the command is recorded in the file)."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("<redacted>")
            hide = False
        elif arg == "--admin-key":
            out.append(arg)
            hide = True
        elif arg.startswith("--admin-key="):
            out.append("--admin-key=<redacted>")
        else:
            out.append(arg)
    return out
