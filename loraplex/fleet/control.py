"""``fleet up``, ``fleet status`` and ``fleet down``: a Ray cluster, the Serve application on it,
and what ``up`` started recorded so ``down`` stops exactly that.

``up`` without an address starts a local Ray head (``fleet/ray_cluster.py``: its own process
group, a token) and records it in ``<data dir>/fleet.json``; ``down`` stops that process group
only. With an address ``up`` joins that cluster and ``down`` leaves it running. Before
deploying, ``up`` prepares what every deployment reads: the demo model and adapters (when no
model is given), the demo registration and the keys (printed once), the admin key. It returns
once ``/ready`` answers 200 (every engine replica reported) or fails after ``ready_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from loraplex.fleet.bounded import NoAnswer, call_in_child, check_timeout
from loraplex.fleet.ray_cluster import connect, start_local_cluster, stop_local_cluster
from loraplex.fleet.settings import APP_NAME, FleetSettings
from loraplex.registry import default_data_dir
from loraplex.serve.config import ServeConfig
from loraplex.serve.program import program

STATE_FILE = "fleet.json"
RAY_LOG = "ray-head.log"  # the local Ray head's output, in the data dir
RAY_TOKEN = "ray-auth-token"  # the local Ray head's authentication token, in the data dir
DEFAULT_READY_TIMEOUT_S = 300.0
REPLICAS_DIR = "replicas"  # each engine replica's disk cache, ``<data dir>/replicas/<id>``
GCS_PROBE_TIMEOUT_S = 2.0  # a recorded cluster whose GCS port does not accept in this is down
STATUS_TIMEOUT_S = 60.0  # ``fleet status`` connects and reads the board within this
# Ray Serve's refusal of ``serve.delete`` on a cluster that runs no Serve instance
NO_SERVE_INSTANCE = "There is no Serve instance running on this Ray cluster."
STORE_READ_TIMEOUT_S = 30.0  # one read of the board's store, once connected


@dataclass(frozen=True)
class FleetRecord:
    """What ``up`` started (``<data dir>/fleet.json``)."""

    address: str  # the Ray cluster's GCS address
    started_cluster: bool  # True: ``up`` started it, ``down`` stops it
    process_group: int | None  # the Ray head's process group when ``up`` started it
    token_path: str | None  # its authentication token (0600) when ``up`` started it
    url: str  # the ingress's base URL
    engine_replicas: int


@dataclass(frozen=True)
class Prepared:
    model_dir: Path  # the base model every replica loads
    admin_key: str
    new_admin_key: bool  # created now (printed once)
    sample_keys: dict[str, str]  # demo tenant -> API key, when issued now


def prepare(config: ServeConfig, replicas_here: int | None = None) -> Prepared:
    """The model, the demo registration and the keys, before any deployment starts (replicas
    would otherwise race to generate and register them). Before a key is issued, the checks
    ``serve`` makes once the model is known: ``max_model_len`` within its context, the GPU
    slots ``gpu_adapter_bytes`` leaves (at least one, more than ``max_auto_gpu_slots``), and the KV
    caches of the ``replicas_here`` engines this machine runs (``fleet up``'s local Ray head
    runs them all; None: where they run is not known here) within its memory. A ``mode``
    merging a revision the registry lacks is one WARNING, as at ``serve``'s start."""
    from loraplex.artifacts.base_model import BaseModelSpec, read_model_config
    from loraplex.registry import open_registry
    from loraplex.serve.assembly import demo_assets
    from loraplex.serve.bootstrap import ADMIN_KEY_FILE, admin_key, register_demo, sample_keys
    from loraplex.serve.config import memory_total_bytes
    from loraplex.serve.engine_settings import registry_config
    from loraplex.serve.merge_target import warn_if_unregistered

    config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    assets = demo_assets(config)
    model_dir = assets.base_model_dir if assets is not None else config.model
    if model_dir is None:
        raise ValueError("model None is invalid; expected a model directory or the demo assets")
    base = BaseModelSpec.from_dir(model_dir)
    config.check_context(read_model_config(model_dir))
    # gpu_adapter_bytes below one slot, or max_auto_gpu_slots not below the slots it leaves:
    # each replica's engine refused them at start, after the keys were issued and printed
    config.auto_gpu_slots(base)
    if replicas_here is not None:
        config.check_kv_memory(base, memory_total_bytes(), replicas_here)
    new_admin = config.admin_key is None and not (config.data_dir / ADMIN_KEY_FILE).exists()
    admin = config.admin_key or admin_key(config.data_dir)
    keys: dict[str, str] = {}
    registry = open_registry(registry_config(config), base=base)
    try:
        if assets is not None and config.demo:
            state = register_demo(registry, assets)
            keys = sample_keys(registry, state.tenants, config.data_dir)
        warn_if_unregistered(config.mode, registry)  # as serve does, after the demo's
    finally:
        registry.close()
    return Prepared(model_dir, admin, new_admin, keys)


def check_listen(config: ServeConfig) -> None:
    """RuntimeError unless ``config.host:port`` (and the admin address, when ``admin_port`` is
    set) is free, checked as ``serve`` and the fleet's own listener bind (without
    SO_REUSEPORT), before any key is issued. NOTE: Ray Serve's proxy sets SO_REUSEPORT, so a
    second fleet's proxy bound the port of a running one and the kernel split connections
    between them (a key valid on one fleet got 401 from the other half the time); this bind
    fails instead."""
    from loraplex.server.listeners import bind_all

    try:
        sockets = bind_all(config.host, config.port, config.admin_host, config.admin_port)
    except OSError as exc:
        raise RuntimeError(
            f"cannot listen on {config.host}:{config.port}"
            + ("" if config.admin_port is None else f" and admin port {config.admin_port}")
            + f": {exc.strerror or exc} (another fleet or server holds it? `loraplex fleet "
            "down`, or choose another port)"
        ) from exc
    for sock in sockets:
        sock.close()


def deploy(settings: FleetSettings) -> None:
    """The Serve application on the connected cluster: Serve starts no HTTP proxy and the
    ingress listens itself on ``serve.host:serve.port``, on this node (the address is this
    machine's)."""
    import ray
    from ray import serve

    from loraplex.fleet.deployments import build_app

    serve.start(proxy_location="Disabled")
    node = ray.get_runtime_context().get_node_id()
    app = build_app(settings, ingress_node=node)
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)


def wait_ready(url: str, timeout_s: float) -> None:
    """Returns once ``url``/ready answers 200; RuntimeError with the last answer after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            reply = httpx.get(f"{url}/ready", timeout=5.0)
            if reply.status_code == 200:
                return
            last = f"{reply.status_code} {reply.text[:200]}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(1.0)
    raise RuntimeError(f"the fleet at {url} was not ready within {timeout_s:g} s: {last}")


def base_url(config: ServeConfig) -> str:
    return f"http://{_reachable(config.host)}:{config.port}"


def admin_url(config: ServeConfig) -> str | None:
    """The admin socket's base URL; None without ``admin_port`` (admin routes on the API's)."""
    if config.admin_port is None:
        return None
    return f"http://{_reachable(config.admin_host or config.host)}:{config.admin_port}"


def _reachable(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def up(
    settings: FleetSettings,
    address: str | None,
    *,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> FleetRecord:
    """Starts (or joins) the cluster, deploys, waits for /ready; records what it started."""
    state_path = settings.serve.data_dir / STATE_FILE
    check_no_fleet(settings.serve.data_dir)
    check_listen(settings.serve)
    started = address is None
    group = None
    token = None
    if address is None:
        token = settings.serve.data_dir / RAY_TOKEN
        address, group = start_local_cluster(settings.serve.data_dir / RAY_LOG, token)
    url = base_url(settings.serve)
    token_text = None if token is None else str(token)
    record = FleetRecord(address, started, group, token_text, url, settings.engine_replicas)
    try:
        connect(address, token)
        deploy(settings)
        state_path.write_text(json.dumps(asdict(record)), encoding="utf-8")
        wait_ready(record.url, ready_timeout_s)
    except BaseException:
        if group is not None:
            stop_local_cluster(group)
        else:  # a cluster up joined: remove what it deployed there, leave the cluster
            _delete_app_quietly()
        state_path.unlink(missing_ok=True)
        raise
    return record


def _delete_app_quietly() -> None:
    import ray

    if not ray.is_initialized():
        return
    from ray import serve

    with contextlib.suppress(Exception):  # the failure being raised matters more
        serve.delete(APP_NAME)


def fleet_command(command: str, data_dir: Path) -> str:
    """``loraplex fleet COMMAND`` as the operator should type it for ``data_dir``: the
    ``loraplex`` they ran (``program``), with ``--data-dir`` unless it is the default (``fleet
    down`` alone found no fleet that ``up --data-dir D`` started, while ``up`` said "stop it with:
    loraplex fleet down")."""
    if data_dir == default_data_dir(os.environ, Path.home()):
        return f"{program()} fleet {command}"
    return f"{program()} fleet {command} --data-dir {shlex.quote(str(data_dir))}"


def read_record(data_dir: Path) -> FleetRecord:
    path = data_dir / STATE_FILE
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RuntimeError(
            f"no fleet is recorded in {path}; start one with `{fleet_command('up', data_dir)}` "
            "(or name the data directory `up` used: --data-dir or LORAPLEX_DATA_DIR)"
        ) from None
    return FleetRecord(**values)


def cluster_down_reason(record: FleetRecord, timeout_s: float = GCS_PROBE_TIMEOUT_S) -> str | None:
    """Why the recorded cluster is not running; None when its GCS accepts a connection. Checked
    before connecting: a driver connecting to a GCS that is gone retries without end (``fleet
    status`` and ``fleet down`` printed Ray's "Failed to connect to GCS" for minutes after the
    Ray head had died), so the record of a crashed fleet could be neither read nor removed, and
    ``up`` refused the data directory."""
    group = record.process_group
    if record.started_cluster and group is not None and not _group_alive(group):
        return (
            f"its Ray head (process group {group}) is not running: it crashed, was killed or "
            "the machine restarted"
        )
    host, _, port = record.address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"its Ray cluster at {record.address} does not answer ({reason})"


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user has that id now: the GCS probe decides
        return True
    return True


def check_no_fleet(data_dir: Path) -> None:
    """RuntimeError when ``data_dir`` records a fleet, saying whether it runs and what to do;
    ``up`` checks it before any key is issued."""
    path = data_dir / STATE_FILE
    if not path.exists():
        return
    try:
        record = read_record(data_dir)
    except (ValueError, TypeError) as exc:  # not a record ``up`` wrote
        raise RuntimeError(
            f"{path} is not a fleet record ({exc}); remove it if no fleet runs from {data_dir}"
        ) from exc
    reason = cluster_down_reason(record)
    if reason is None:
        raise RuntimeError(
            f"a fleet of this data directory already runs at {record.url} (recorded in {path}):"
            f" `{fleet_command('status', data_dir)}` shows it, "
            f"`{fleet_command('down', data_dir)}` stops it"
        )
    raise RuntimeError(
        f"a fleet is recorded in {path} but is not running: {reason}; "
        f"`{fleet_command('down', data_dir)}` clears the record, then start it again"
    )


def connect_recorded(record: FleetRecord, data_dir: Path) -> None:
    """Connects to the recorded cluster; RuntimeError saying what to do when it is down."""
    reason = cluster_down_reason(record)
    if reason is not None:
        raise RuntimeError(
            f"the fleet recorded in {data_dir / STATE_FILE} is not running: {reason}; "
            f"`{fleet_command('down', data_dir)}` clears the record, "
            f"then `{fleet_command('up', data_dir)}` starts it again"
        )
    connect(record.address, _token(record))  # NOTE: before ray is imported (see connect)


def board_entries(
    record: FleetRecord, data_dir: Path, timeout_s: float = STATUS_TIMEOUT_S
) -> list[Any]:
    """Every replica on the board, read within ``timeout_s`` (``fleet status --timeout-s``) by a
    child process that connects to the cluster (``fleet/bounded.py``); RuntimeError saying why
    not."""
    hint = f"try again, or `{fleet_command('down', data_dir)}` if it is gone for good"
    try:
        return list(call_in_child(_read_board, (record, data_dir), timeout_s))
    except NoAnswer:
        raise RuntimeError(_no_answer(record, timeout_s, hint)) from None


def _no_answer(record: FleetRecord, timeout_s: float, then: str) -> str:
    return (
        f"the fleet's Ray cluster at {record.address} did not answer within {timeout_s:g} s "
        "(--timeout-s): its GCS accepts connections but does not answer (its Ray head is "
        f"stopped, hung or overloaded); {then}"
    )


def _read_board(record: FleetRecord, data_dir: Path) -> list[Any]:
    """``board_entries``'s child."""
    connect_recorded(record, data_dir)
    from loraplex.fleet.board_store import read_store

    return list(read_store(timeout_s=STORE_READ_TIMEOUT_S))


def _delete_app(record: FleetRecord) -> bool:
    """``down``'s child: the application deleted, the driver disconnected; False when the cluster
    runs no Serve instance (nothing to delete: Ray Serve refuses the delete with an error)."""
    connect(record.address, _token(record))  # NOTE: before ray is imported (see connect)
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        serve.delete(APP_NAME)
    except RayServeException as exc:
        if NO_SERVE_INSTANCE not in str(exc):
            raise
        ray.shutdown()
        return False
    serve.shutdown()
    ray.shutdown()  # NOTE: before the head stops, or the driver reports the raylet's death
    return True


def _token(record: FleetRecord) -> Path | None:
    return None if record.token_path is None else Path(record.token_path)


@dataclass(frozen=True)
class Stopped:
    """What ``down`` did."""

    record: FleetRecord
    not_running: str | None  # why the cluster could not be reached (the record was removed)
    no_serve: bool = False  # the cluster answered but ran no Serve instance: nothing deleted


def down(data_dir: Path, timeout_s: float = STATUS_TIMEOUT_S) -> Stopped:
    """Deletes the application within ``timeout_s`` (``fleet down --timeout-s``, from a child
    process as ``board_entries``); stops the cluster when ``up`` started it, and then removes the
    replicas' disk caches (a replica that was killed left its own behind). A cluster that is not
    running (its head crashed, the machine restarted) is not connected to: its record is
    removed, so ``up`` can start the fleet again."""
    check_timeout(timeout_s)  # NOTE: before the try: a refused flag stops and removes nothing
    record = read_record(data_dir)
    reason = cluster_down_reason(record)
    deleted = True
    try:
        if reason is None:
            deleted = call_in_child(_delete_app, (record,), timeout_s)
    except NoAnswer:
        raise RuntimeError(_no_answer(record, timeout_s, _down_anyway(record))) from None
    finally:
        # NOTE: not a group whose head is gone: after a restart its id may be another process's
        if record.process_group is not None and reason is None:
            stop_local_cluster(record.process_group)
        (data_dir / STATE_FILE).unlink(missing_ok=True)
    if record.started_cluster:  # no replica of this data directory runs any more
        shutil.rmtree(data_dir / REPLICAS_DIR, ignore_errors=True)
    return Stopped(record, reason, no_serve=not deleted)


def _down_anyway(record: FleetRecord) -> str:
    """What ``down`` did all the same when the cluster did not answer (its record is removed)."""
    if record.process_group is not None:
        return f"its Ray head (process group {record.process_group}) is stopped, its record removed"
    return (
        f"its record is removed; the application {APP_NAME!r} may still be deployed on "
        f"{record.address} (a joined cluster is left running)"
    )
