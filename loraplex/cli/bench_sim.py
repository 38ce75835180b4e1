"""``loraplex bench sim``: the simulator against real single-server and fleet runs, and at scale
(one JSON line; docs/simulator.md, "Calibration, validation, planner")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loraplex.cli.bench.options import logs_dir_ready
from loraplex.cli.registry_access import command_group

if TYPE_CHECKING:
    from loraplex.sim.cost_model import CostModel


def register(app: typer.Typer) -> None:
    command_group(app, "bench", "Benchmarks.").command("sim")(bench_sim)


DEFAULT_HARDWARE = "cpu-demo-small"  # the in-run calibration's name without --hardware


def _names(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def bench_sim(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON line.")] = False,
    traces: Annotated[
        str, typer.Option(help="Validated traces.")
    ] = "zipf-longtail,hot-burst,cold-storm",
    targets: Annotated[str, typer.Option(help="single and/or fleet.")] = "single,fleet",
    trace_requests: Annotated[int, typer.Option(help="Mean requests per trace.")] = 96,
    repeats: Annotated[
        int, typer.Option(help="Real runs of each trace, compared by their median.")
    ] = 1,
    rate: Annotated[float, typer.Option(help="Mean requests per second of each trace.")] = 2.0,
    num_adapters: Annotated[int, typer.Option(help="zipf-longtail's adapters.")] = 32,
    max_loras: Annotated[int, typer.Option(help="GPU slots per server / replica.")] = 4,
    replicas: Annotated[int, typer.Option(help="Fleet engine replicas.")] = 3,
    cost_model: Annotated[
        Path | None,
        typer.Option(help="Cost-model file (default: calibrate a fresh demo server first)."),
    ] = None,
    calibrated_out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the in-run calibration's cost-model file here (without --cost-model, "
            "or with --calibrate-interleaved)."
        ),
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            help="The in-run calibration's hardware name (cpu-demo-small; without --cost-model, "
            "or with --calibrate-interleaved): a free-form label of this machine, recorded in "
            "the cost model as `sim calibrate --hardware`'s, not a profile looked up."
        ),
    ] = None,
    logs_dir: Annotated[
        Path | None,
        typer.Option(
            help="Keep each real single-server run's request log and client records, each real "
            "fleet run's client records (and the in-run calibration's request log) in this new "
            "or empty directory.",
            resolve_path=True,  # the servers run elsewhere: a relative path is read from here
        ),
    ] = None,
    calibrate_interleaved: Annotated[
        int,
        typer.Option(
            help="Run the in-run calibration as short passes of 1/K of its samples, one before "
            "each real run and one after the last, and price each trace from the passes around "
            "its runs (0: one calibration first, or none with --cost-model). With --cost-model "
            "(both targets needed) the passes run around the single runs only and price the "
            "single server; the fleet keeps the file's pricing."
        ),
    ] = 0,
    calibrate_fleet_interleaved: Annotated[
        int,
        typer.Option(
            help="With --cost-model (a `sim calibrate-fleet` file) and the fleet target: measure "
            "the fleet's lone terms as short passes of 1/K of calibrate-fleet's lone requests "
            "(and one lone cold request on each of 4 cold adapters, or "
            "--calibrate-fleet-cold-requests: fleet_load_scale, replacing the file's) in the "
            "run's Ray cluster, one before each fleet run and one after the last, and price "
            "each fleet trace from the passes around its runs (0: the file's terms)."
        ),
    ] = 0,
    calibrate_fleet_cold_requests: Annotated[
        int | None,
        typer.Option(
            help="With --calibrate-fleet-interleaved: lone cold requests per fleet pass, each "
            "on an adapter of its own, timed by the fleet's stage counters (default 4; 0, or 3 "
            "to 256; 0: none, the file's fleet_load_scale prices the fleet's loads)."
        ),
    ] = None,
    fleet_id_draws: Annotated[
        int | None,
        typer.Option(
            help="Simulate each fleet trace this many more times, its replicas named by fresh "
            "Ray-like random ids each time, and compare the real runs' hit ratios with these "
            "simulations' mean: for runs of a fleet that placed by Ray's random replica ids "
            "(before 2026-12-06; a fleet now places by rank, as the simulator does) "
            "(default 0: the simulator's own rank names alone)."
        ),
    ] = None,
    no_scale: Annotated[
        bool, typer.Option("--no-scale", help="Skip the 1M-request scale run.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Workload, prompt and router seed.")] = 0,
    asset_dir: Annotated[
        Path, typer.Option(help="Demo assets cache (the base model is <dir>/test-small).")
    ] = Path(".loraplex-assets"),
) -> None:
    """Real vs simulated per-tier hit ratios, TTFT P50/P99 and throughput on a single server and
    a fleet (errors per target), and the simulator's time for 1M requests."""
    from loraplex.bench.sim.bench import run_sim_bench
    from loraplex.bench.sim.config import SimBenchConfig
    from loraplex.bench.sim.validate import RealSettings
    from loraplex.sim.cost_model import load

    try:
        config = SimBenchConfig(
            traces=_names(traces),
            targets=_names(targets),
            trace_requests=trace_requests,
            repeats=repeats,
            rate=rate,
            num_adapters=num_adapters,
            settings=RealSettings(max_loras=max_loras, replicas=replicas, seed=seed),
            cost_model=cost_model,
            scale=None if no_scale else (1_000_000, 10_000, 64),
            seed=seed,
            asset_dir=asset_dir,
            logs_dir=logs_dir,
            calibrate_interleaved=calibrate_interleaved,
            calibrate_fleet_interleaved=calibrate_fleet_interleaved,
            calibrate_fleet_cold_requests=calibrate_fleet_cold_requests,
            **({} if fleet_id_draws is None else {"fleet_id_draws": fleet_id_draws}),
        )
        model = load(cost_model) if cost_model is not None else None
        fleet_passes = None
        if calibrate_fleet_interleaved and model is not None:
            from loraplex.bench.sim.fleet_interleaved import InterleavedFleet
            from loraplex.bench.sim.fleet_lone import PASS_COLD_REQUESTS

            colds = config.calibrate_fleet_cold_requests
            fleet_passes = InterleavedFleet(
                calibrate_fleet_interleaved, model, logs_dir,
                cold_requests=PASS_COLD_REQUESTS if colds is None else colds,
            )  # fmt: skip
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    for flag, given in (("--calibrated-out", calibrated_out), ("--hardware", hardware)):
        if model is not None and not calibrate_interleaved and given is not None:
            raise typer.BadParameter(
                f"{flag} is for the in-run calibration; with --cost-model and no "
                "--calibrate-interleaved there is none",
                param_hint=flag,
            )
    hardware = DEFAULT_HARDWARE if hardware is None else hardware.strip()
    if not hardware:
        raise typer.BadParameter(
            "--hardware must name the measured hardware", param_hint="--hardware"
        )
    if logs_dir is not None:
        try:
            logs_dir_ready(logs_dir)
        except (ValueError, OSError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--logs-dir") from exc
    interleaved = None
    if calibrate_interleaved:
        from loraplex.bench.sim.interleaved import InterleavedCalibration

        interleaved = InterleavedCalibration(
            asset_dir, max_loras, hardware, calibrate_interleaved, logs_dir
        )
    elif model is None:
        from loraplex.bench.sim.fit_check import BrokenFit

        try:
            model = _calibrated(asset_dir, max_loras, hardware, logs_dir)
        except BrokenFit as exc:  # no model to price the traces with: nothing is run
            typer.echo(f"error: the in-run calibration: {exc}", err=True)
            raise typer.Exit(1) from exc
        if calibrated_out is not None:
            model.save(calibrated_out)
    result = run_sim_bench(config, model, interleaved, fleet_passes)
    if interleaved is not None and calibrated_out is not None:  # all kept passes merged
        interleaved.model_of(interleaved.kept())[0].save(calibrated_out)
    if not as_json:
        typer.echo(f"cost model: {result['metrics']['cost_model']}", err=True)
    typer.echo(json.dumps(result, allow_nan=False))


def _calibrated(asset_dir: Path, max_loras: int, hardware: str, logs_dir: Path | None) -> CostModel:
    """A cost model from ``sim calibrate --self`` on a fresh demo server; with ``logs_dir``,
    its report (``sim calibrate --report``'s) and its server's request log are kept there
    (``calibration.samples.json``, ``calibration.requests.jsonl``)."""
    import shutil

    from loraplex.bench.sim.calibrate_run import CalibrateConfig, slots_for_mixes
    from loraplex.bench.sim.calibrate_target import self_target
    from loraplex.bench.sim.calibration import calibrate
    from loraplex.bench.sim.fit_check import BrokenFit

    sets = ("attn", "all")  # both target sets: the weight terms are fitted
    config = CalibrateConfig()
    # NOTE: with fewer slots than this the calibration's largest mix may not fit beside the
    # server's automatic GPU pins (a 503 on its prefetch was seen with 4 slots, when a tenant's
    # share was a hard cap)
    slots = max(max_loras, slots_for_mixes(config))
    with self_target(asset_dir, (8, 16, 32, 64), 2, slots, 0, target_sets=sets) as target:
        try:
            model, report = calibrate(
                target, config, hardware, "loraplex bench sim (calibrate --self)"
            )
        except BrokenFit as exc:  # its report kept too (the checks in it), then refused
            model, report = None, exc.report
        if logs_dir is not None:  # what ``sim calibrate --report`` writes, and the server's log
            text = json.dumps(report, sort_keys=True) + "\n"
            (logs_dir / "calibration.samples.json").write_text(text, encoding="utf-8")
            if target.request_log is not None:
                shutil.copyfile(target.request_log, logs_dir / "calibration.requests.jsonl")
    if model is None:
        raise BrokenFit(report["fit_check"]["measurements"][-1], report)
    return model
