"""``loraplex fleet up | status | down``: loraplex engine replicas on Ray Serve behind one
ingress (``docs/fleet.md``).

``up`` takes ``serve``'s configuration (the same ``--config`` TOML ``[serve]`` table, the common
flags below) plus the fleet's own settings (flags, or a ``[fleet]`` table in the same file), starts
a local Ray head or joins ``--address``, deploys, prints the keys it issued and returns once
``/ready`` answers. ``status`` prints every replica from the fleet board; ``down`` removes the
application and stops the Ray head ``up`` started.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loraplex.cli.locations import DatabaseUrl, DataDir, S3Endpoint, Store, unusable_path
from loraplex.cli.serve_options import (
    AdminKey,
    Host,
    LogLevel,
    MaxLoras,
    Model,
    NoDemo,
    Port,
    SharedStateUrl,
    bad_parameter,
)
from loraplex.cli.serve_start import check_fds, say_demo_generation, say_how_to_get_a_tenant_key
from loraplex.cli.vllm_flags import VllmAwareCommand
from loraplex.fleet.settings import FLEET_KEYS
from loraplex.registry import default_data_dir
from loraplex.serve.logs import configure_logging

if TYPE_CHECKING:
    from loraplex.fleet.control import FleetRecord, Prepared
    from loraplex.fleet.settings import FleetSettings
    from loraplex.router.fleet_state import ReplicaState
    from loraplex.serve.config import ServeConfig

Opt = typer.Option
# ``status`` and ``down`` connect in a child process killed after this (fleet/bounded.py)
TimeoutS = Annotated[
    float, Opt(help="Give up (exit 1) when the cluster has not answered in this long.")
]
fleet_app = typer.Typer(help="Engine replicas on Ray Serve with residency-aware routing.")


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")


def fleet_file_values(path: Path | None) -> dict[str, Any]:
    """The ``[fleet]`` table of the config file (unknown keys refused)."""
    if path is None:
        return {}
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"config file {path}: {exc}") from exc
    table = document.get("fleet", {})
    if not isinstance(table, dict):
        raise ValueError(f"config file {path}: [fleet] is invalid; expected a table")
    unknown = sorted(set(table) - set(FLEET_KEYS))
    if unknown:
        raise ValueError(
            f"config file {path}: unknown [fleet] keys {unknown}; expected {FLEET_KEYS}"
        )
    return dict(table)


def check_engine_resource(engine_resource: str | None, address: str | None) -> None:
    """The local Ray head ``up`` starts advertises no custom resource: engines asking for one
    would never be placed, so the key is refused there, by name."""
    if engine_resource is not None and address is None:
        raise ValueError(
            f"engine_resource {engine_resource!r} is not used without --address: the local Ray "
            "head `up` starts advertises no custom resource (engines would never be placed); "
            "remove it, or join a cluster whose engine nodes advertise it"
        )


def fleet_settings(serve_config: ServeConfig, values: dict[str, Any]) -> FleetSettings:
    """The fleet's settings from its keys (``[fleet]``'s, and ``fleet up``'s own flags over
    them, ``ready_timeout_s`` among them: checked here, used by ``control.up``)."""
    from loraplex.fleet.settings import FleetSettings

    values = dict(values)
    check_ready_timeout(values.pop("ready_timeout_s", None))
    return FleetSettings(
        serve=serve_config,
        model_dir=serve_config.model or serve_config.data_dir,
        engine_replicas=values.pop("replicas", 2),
        **values,
    )


def check_ready_timeout(value: float | None) -> None:
    """``--ready-timeout-s``: a finite, positive wait (``nan`` waited for nothing and failed
    the fleet as "not ready"; ``inf`` waited forever)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"ready_timeout_s {value} is invalid; expected a finite number of seconds > 0"
        )


def default_threads_per_replica(replicas: int, num_cores: int | None) -> int:
    """torch threads of each engine replica when none were configured: the cores shared out,
    at least one (the ingress and Ray's own processes take little CPU between requests)."""
    return max(1, (num_cores or 1) // replicas)


@fleet_app.command("up", cls=VllmAwareCommand)
def up_command(
    *,
    config: Annotated[
        Path | None, Opt(help="TOML file: a 'serve' table (as serve) and a 'fleet' table.")
    ] = None,
    replicas: Annotated[int | None, Opt(help="Engine replicas (default: 2).")] = None,
    policy: Annotated[
        str | None, Opt(help="Routing policy (default: affinity_until_saturated).")
    ] = None,
    seed: Annotated[int | None, Opt(help="Seed of the router's random choices.")] = None,
    address: Annotated[
        str | None, Opt(help="Join this Ray cluster (host:port) instead of starting one.")
    ] = None,
    host: Host = None,
    port: Port = None,
    model: Model = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
    shared_state_url: SharedStateUrl = None,
    max_loras: MaxLoras = None,
    threads: Annotated[
        int | None, Opt(help="torch threads per replica (default: cores / replicas).")
    ] = None,
    admin_key: AdminKey = None,
    no_demo: NoDemo = False,
    log_level: LogLevel = None,
    ready_timeout_s: Annotated[float, Opt(help="Wait this long for /ready.")] = 300.0,
) -> None:
    """Start (or join) a Ray cluster and deploy the fleet; returns once it is ready."""
    from loraplex.cli.serve import check_before_keys
    from loraplex.fleet import control
    from loraplex.serve.config import merge, read_config_file, settled

    flags: dict[str, Any] = {
        "host": host,
        "port": port,
        "model": model,
        "data_dir": data_dir,
        "database_url": database_url,
        "store": store,
        "s3_endpoint": s3_endpoint,
        "shared_state_url": shared_state_url,
        "max_loras": max_loras,
        "torch_threads": threads,
        "admin_key": admin_key,
        "demo": False if no_demo else None,
        "log_level": log_level,
    }
    try:
        file_values = read_config_file(config, ("fleet",)) if config is not None else {}
        fleet_values = fleet_file_values(config)
        if "data_dir" not in file_values:  # a default, under the flags (no flag of the user's)
            file_values["data_dir"] = default_data_dir(os.environ, Path.home())
        # with serve's own checks (cli/serve.py): the engine's settings (class_reserve_seqs, KV
        # room for one max_model_len sequence), import_dir, request_log_path and
        # trace_endpoint's extra, which failed only in the replicas (or at the first
        # registration by path), after the keys were issued
        serve_config = merge(file_values, flags, check_before_keys)
        own_flags: dict[str, Any] = {"replicas": replicas, "policy": policy, "seed": seed}
        given = {k: v for k, v in own_flags.items() if v is not None}
        given["ready_timeout_s"] = ready_timeout_s
        # NOTE: every setting is checked before ``prepare`` issues keys (shown once); a refusal
        # names the flags it is owed to, else the file (as serve's flags: ``settled``)
        checked = settled(lambda g: fleet_settings(serve_config, {**fleet_values, **g}), given)
        check_engine_resource(checked.engine_resource, address)
        if serve_config.torch_threads is None:
            per_replica = default_threads_per_replica(checked.engine_replicas, os.cpu_count())
            serve_config = replace(serve_config, torch_threads=per_replica)
        # the ingress's listener rechecks in its replica, where a failure only shows as /ready
        # never answering: here it is one 'error:' line and exit 1 (serve's own check)
        check_fds(serve_config)
        try:  # before any key is issued
            control.check_no_fleet(serve_config.data_dir)
            control.check_listen(serve_config)
        except RuntimeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        say_demo_generation(serve_config)
        # the local Ray head runs every replica on this machine; a joined cluster, anywhere
        replicas_here = checked.engine_replicas if address is None else None
        configure_logging(serve_config.log_level)  # prepare's WARNING lines, formatted
        prepared = control.prepare(serve_config, replicas_here)
        settings = replace(checked, serve=serve_config, model_dir=prepared.model_dir)
    except (ValueError, TypeError) as exc:
        raise bad_parameter(exc, config) from exc
    except OSError as exc:  # e.g. --data-dir names a file
        raise typer.BadParameter(unusable_path(exc)) from exc
    try:  # this process's lines (the fleet's control) are logged as configured above
        record = control.up(settings, address, ready_timeout_s=ready_timeout_s)
    except BaseException as exc:
        _say_not_started(prepared, serve_config)
        if isinstance(exc, RuntimeError):
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        raise
    _print_started(record, control.admin_url(settings.serve))
    _print_keys(prepared, serve_config)
    directory = serve_config.data_dir
    typer.echo(
        f"see it with: {control.fleet_command('status', directory)}; "
        f"stop it with: {control.fleet_command('down', directory)}"
    )


def _say_not_started(prepared: Prepared, config: ServeConfig) -> None:
    """NOTE: the keys ``prepare`` issued are valid and shown only now: never lose them."""
    if prepared.new_admin_key or prepared.sample_keys:
        typer.echo("the fleet did not start; the keys issued for it stay valid:", err=True)
        _print_keys(prepared, config)
    else:  # it said "the keys issued ... stay valid:" above lines saying none was issued
        typer.echo("the fleet did not start (no key was issued)", err=True)


def _print_started(record: FleetRecord, admin_url: str | None) -> None:
    """Where the fleet that ``fleet up`` started serves."""
    where = "a local Ray head it started" if record.started_cluster else record.address
    typer.echo(f"loraplex fleet: {record.engine_replicas} engine replicas on {where}")
    typer.echo(f"serving on {record.url}  (OpenAI API at {record.url}/v1)")
    if admin_url is not None:
        typer.echo(f"admin API and /metrics only on {admin_url}")
    typer.echo(f"dashboard:  {admin_url or record.url}/admin/dashboard#key=<admin key>")


def _print_keys(prepared: Prepared, config: ServeConfig) -> None:
    """As ``serve`` says it: secrets only when just created, else where they are kept."""
    kept = config.data_dir / "admin-key"
    if prepared.new_admin_key:
        typer.echo(f"admin key:   {prepared.admin_key}  (shown once; kept in {kept})")
    elif config.admin_key is None:
        typer.echo(f"admin key:   shown only when generated; kept in {kept}")
    for tenant, key in sorted(prepared.sample_keys.items()):
        typer.echo(f"{tenant + ' key:':<12} {key}")
    if not prepared.sample_keys:
        say_how_to_get_a_tenant_key(config)


@fleet_app.command("status")
def status_command(
    *,
    data_dir: DataDir = None,
    as_json: Annotated[bool, Opt("--json", help="One JSON object.")] = False,
    timeout_s: TimeoutS = 60.0,
) -> None:
    """Every engine replica: health, residency per tier and load."""
    from loraplex.fleet import control
    from loraplex.fleet.state import replica_state

    directory = data_dir or default_data_dir(os.environ, Path.home())
    try:
        record = control.read_record(directory)
        entries = control.board_entries(record, directory, timeout_s)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    states = [replica_state(e) for e in entries]
    # the replica's process on its node: an operator's handle on it (kill, py-spy, a frozen one)
    pids = [_pid(e.status) for e in entries]
    logs = [_log(e.status) for e in entries]  # its log file there: where its loraplex lines go
    if as_json:
        replicas = [
            {**s.to_json(), "pid": pid, "log": log}
            for s, pid, log in zip(states, pids, logs, strict=True)
        ]
        typer.echo(
            json.dumps(
                {"url": record.url, "engine_replicas": record.engine_replicas, "replicas": replicas}
            )
        )
        return
    typer.echo(status_headline(record, states))
    typer.echo(
        f"{'replica':<12} {'pid':>8} {'healthy':<8} {'age s':>6} {'L0':>4} {'L1':>4} {'L2':>4} "
        f"{'queued':>7} {'running':>8} {'kv':>5}"
    )
    for s, pid in zip(states, pids, strict=True):
        load = s.load
        typer.echo(
            f"{s.replica_id:<12} {pid or '-':>8} {str(s.healthy).lower():<8} "
            f"{s.report_age_s or 0:>6.1f} "
            f"{s.tiers['l0'].count:>4} {s.tiers['l1'].count:>4} {s.tiers['l2'].count:>4} "
            f"{load.num_queued if load else 0:>7} {load.num_running if load else 0:>8} "
            f"{load.kv_usage if load else 0:>5.2f}"
            + (f"  ({s.down_reason})" if s.down_reason else "")
        )
    for s, log in zip(states, logs, strict=True):
        typer.echo(f"log of {s.replica_id}: {log or LOG_UNKNOWN}")


# a replica whose stderr is not a file (or an older replica): where Ray keeps it by default
LOG_UNKNOWN = "not reported; see <Ray temp dir>/session_latest/logs/worker-*-<pid>.err on its node"
MAX_LOG_PATH_CHARS = 4096  # a board entry's ``log`` longer than this is not printed


def _log(status: dict[str, Any]) -> str | None:
    log = status.get("log")
    return log if isinstance(log, str) and 0 < len(log) <= MAX_LOG_PATH_CHARS else None


def _pid(status: dict[str, Any]) -> int | None:
    pid = status.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def status_headline(record: FleetRecord, states: list[ReplicaState]) -> str:
    """``fleet status``'s first line: the replicas ``up`` asked for and those on the board. A
    replica that died stays on the board, stale, until it is forgotten (60 s), beside the one
    Ray Serve started in its place: "3 engine replicas" of a fleet of 2 said neither."""
    healthy = sum(s.healthy for s in states)
    return (
        f"fleet at {record.url}: {record.engine_replicas} engine replicas asked for, "
        f"{len(states)} on the board, {healthy} healthy"
    )


@fleet_app.command("down")
def down_command(*, data_dir: DataDir = None, timeout_s: TimeoutS = 60.0) -> None:
    """Remove the fleet's application; stop the Ray head that fleet up started."""
    from loraplex.fleet import control

    directory = data_dir or default_data_dir(os.environ, Path.home())
    try:
        stopped = control.down(directory, timeout_s)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    record = stopped.record
    if stopped.not_running is not None:
        typer.echo(
            f"fleet at {record.url} was not running ({stopped.not_running}); its record is "
            "removed"
            + ("" if record.started_cluster else f": nothing was deleted on {record.address}")
        )
        return
    what = " and stopped its Ray head" if record.started_cluster else ""
    if stopped.no_serve:
        typer.echo(
            f"fleet at {record.url}: no Serve instance runs on {record.address}, nothing to "
            f"delete; its record is removed{what}"
        )
        return
    typer.echo(f"fleet at {record.url} removed{what}")
