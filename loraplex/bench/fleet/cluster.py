"""The Ray side of ``loraplex bench fleet``: one local Ray cluster for the whole run, one Serve
deployment of the fleet per policy run, and the counters read back at the end of a run.

The cluster is ``ray.init(address="local")`` in this process: it belongs to this process alone
(another Ray on the machine is neither joined nor stopped), its GCS takes a free port the OS
picks (never Redis's 6379; outside Ray's worker range 10002-19999), it requires a token kept in
its own temporary directory (never Ray's default ``~/.ray``), and Serve runs no HTTP proxy: each
deployment's ingress listens on 127.0.0.1 with loraplex's own listener, as under ``fleet up``
(``fleet/listener.py``), so the bench measures the path users get. ``ray.shutdown()`` in
``finally`` stops every process it started.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout, suppress
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.fleet.report import ReplicaCounters, counters_of
from loraplex.fleet.settings import APP_NAME, FleetSettings
from loraplex.serve.config import ServeConfig

RAY_NAMESPACE = "loraplex-bench-fleet"
READY_TIMEOUT_S = 300.0  # a deployment's replicas must all report within this
ROUTER_SETTLE_S = 1.5  # after the replicas reported: the router has their routing stats too
SETTLE_TIMEOUT_S = 30.0  # the replicas must push their counters within this after a replay
# A board entry counts as taken after the replay when it arrived at least this long after it
# ended (the status is computed just before the push; the read itself takes a moment).
SETTLE_MARGIN_S = 0.5
POLL_S = 0.25
RELEASE_TIMEOUT_S = 30.0  # a deleted deployment's ingress must free its port within this


@contextmanager
def local_cluster(num_cpus: int) -> Iterator[int]:
    """A Ray cluster of this process with Ray Serve started (no HTTP proxy); yields a free
    127.0.0.1 port for the deployments' ingress. Stopped (every process it started) when the
    block ends."""
    # NOTE: Ray's driver prints the cluster's error messages to sys.stdout (at shutdown: "the
    # actor is dead because it was killed by ray.kill"), where only the JSON line belongs.
    with redirect_stdout(sys.stderr):
        yield from _ray_cluster(num_cpus)


def _ray_cluster(num_cpus: int) -> Iterator[int]:
    from loraplex.fleet.ray_cluster import free_port, token_env, write_token

    temp = Path(tempfile.mkdtemp(prefix="lpx-ray-"))  # short: Ray's socket paths are bounded
    token = temp / "auth-token"
    write_token(token)
    # NOTE: before ray is imported: Ray reads its authentication settings once, at import.
    # NOTE: Ray renices its workers by +15 (``RAY_worker_niceness``): under the bench lock's
    # ``nice -n -5`` the replicas, which do the measured work, ran at +10, level with everyone's
    # untimed work; at 0 they keep this process's niceness, as ``bench serve``'s servers do.
    os.environ.update(
        {"RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0", **token_env(token)}
    )
    import ray
    from ray import serve

    try:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            namespace=RAY_NAMESPACE,
            logging_level="WARNING",
            log_to_driver=False,
            _temp_dir=str(temp),
        )
        serve.start(proxy_location="Disabled")
        yield free_port()
    finally:
        with suppress(Exception):  # the cluster may not have started
            serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@contextmanager
def deployed(settings: FleetSettings, url: str, admin_key: str) -> Iterator[None]:
    """The fleet of ``settings`` until the block ends (then deleted with every replica), once
    each of its engine replicas reported and the router had time to read their reports."""
    from ray import serve

    from loraplex.fleet.control import wait_ready
    from loraplex.fleet.deployments import build_app

    serve.run(build_app(settings), name=APP_NAME, route_prefix="/", blocking=False)
    try:
        wait_ready(url, READY_TIMEOUT_S)
        wait_replicas(url, admin_key, settings.engine_replicas, READY_TIMEOUT_S)
        time.sleep(ROUTER_SETTLE_S)
        yield
    finally:
        serve.delete(APP_NAME)
        wait_released(settings.serve, RELEASE_TIMEOUT_S)


def wait_released(config: ServeConfig, timeout_s: float) -> None:
    """Returns once the deleted ingress's listener let go of ``config.host:port`` (the next
    deployment binds it again; its replica's process may outlive ``serve.delete`` briefly)."""
    from loraplex.fleet.control import check_listen

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check_listen(config)
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
        time.sleep(POLL_S)


def fleet_state(url: str, admin_key: str) -> dict[str, Any]:
    """The ingress's ``/admin/fleet`` (replicas and routing decisions by reason)."""
    reply = httpx.get(
        f"{url}/admin/fleet", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30.0
    )
    reply.raise_for_status()
    state: dict[str, Any] = reply.json()
    return state


def wait_replicas(url: str, admin_key: str, count: int, timeout_s: float) -> None:
    """Returns once ``/admin/fleet`` shows ``count`` healthy replicas."""
    deadline = time.monotonic() + timeout_s
    healthy = 0
    while time.monotonic() < deadline:
        with suppress(httpx.HTTPError):
            replicas = fleet_state(url, admin_key)["replicas"]
            healthy = sum(bool(r["healthy"]) for r in replicas)
            if healthy >= count:
                return
        time.sleep(POLL_S)
    raise RuntimeError(f"{healthy} of {count} engine replicas were healthy after {timeout_s:g} s")


def board_entries() -> list[Any]:
    """Every replica on the deployed fleet's board (``board.BoardEntry``)."""
    from loraplex.fleet.board_store import read_store

    return list(read_store(timeout_s=30.0))


def settled_counters(count: int, ended_at: float) -> tuple[ReplicaCounters, ...]:
    """Every board replica's counters, once at least ``count`` of them pushed a status after
    ``ended_at`` (``time.monotonic()`` when the replay ended). A replica that left during the
    run keeps its last counters (the requests it served count too)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        entries = board_entries()
        now = time.monotonic()
        fresh = [e for e in entries if now - e.age_s - SETTLE_MARGIN_S >= ended_at]
        if len(fresh) >= count:
            return tuple(counters_of(e.status) for e in entries)
        if now > deadline:
            raise RuntimeError(
                f"{len(fresh)} of {count} engine replicas pushed their counters within "
                f"{SETTLE_TIMEOUT_S:g} s after the replay"
            )
        time.sleep(POLL_S)
