"""The Ray cluster under a fleet: a local head this machine starts and stops, its token, and
this process connected to a cluster as a driver.

A local head is ``ray start --head --block`` in its own process group, its GCS on a free port
(the machine's Redis keeps 6379); only that group is stopped later (never ``ray stop``, which
would stop every Ray on the machine). Ray's token authentication refuses clients without the
head's token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

RAY_STARTED = "Ray runtime started."  # what ``ray start`` prints once the head is up
_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage reporting: no network at run time
_RAY_LOGGERS = ("ray", "ray.serve")  # what a driver logs to stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ray_executable() -> str:
    """The ``ray`` CLI of this Python environment."""
    candidate = Path(sys.executable).parent / "ray"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("ray")
    if found is None:
        raise RuntimeError("the ray CLI is not installed; install loraplex with the fleet extra")
    return found


def write_token(path: Path) -> None:
    """A new Ray authentication token in ``path`` (0600)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(secrets.token_hex(32))


def token_env(token_path: Path) -> dict[str, str]:
    """The environment that makes Ray require (a head) or send (a driver) the fleet's token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}


def start_local_cluster(
    log_path: Path, token_path: Path, timeout_s: float = 120.0
) -> tuple[str, int]:
    """``ray start --head --block`` on this machine in its own process group (its log in
    ``log_path``), requiring the token in ``token_path`` (Ray's token authentication: a client
    without it cannot reach the cluster); (GCS address, process group id) once the head is up.
    Only that group is stopped later (``stop_local_cluster``), never another Ray."""
    port = free_port()
    write_token(token_path)
    command = [
        ray_executable(),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        # NOTE: a loopback node address does not keep Ray 2.60 off the network: its GCS, raylet,
        # object manager and dashboard agent listened on every interface and its client server
        # (10001) on the machine's address too (measured with ``ss -ltn``), and no ``ray start``
        # option binds them (a client server port of 0 is refused). The token is what refuses
        # other clients; docs/fleet.md asks for a firewall on shared hosts.
        "--node-ip-address=127.0.0.1",
        # NOTE: Ray's client server took 10001 on every head, with SO_REUSEPORT: a second local
        # fleet's bound it too and the kernel split ``ray://`` connections between the two
        # clusters (measured with ``ss -ltnp``: two processes on each of 127.0.0.1:10001 and the
        # machine's address). Ray refuses 0, so a free port of this head's own.
        f"--ray-client-server-port={free_port()}",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    env = {**os.environ, **_RAY_ENV, **token_env(token_path)}
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    # NOTE: the GCS port opens seconds before the head is done starting (a driver connecting
    # then fails): wait for ``ray start``'s own "started" line.
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited with {process.returncode}; see {log_path}")
        if RAY_STARTED in log_path.read_text(encoding="utf-8", errors="replace"):
            return f"127.0.0.1:{port}", process.pid
        time.sleep(0.5)
    stop_local_cluster(process.pid)
    raise RuntimeError(f"the Ray head did not listen within {timeout_s:g} s; see {log_path}")


def stop_local_cluster(process_group: int, timeout_s: float = 30.0) -> None:
    """Stops the Ray head ``start_local_cluster`` started (its whole process group)."""
    try:
        os.killpg(process_group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(process_group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process_group, signal.SIGKILL)


def connect(address: str, token_path: Path | None = None) -> None:
    """Connects this process as a driver; with ``token_path``, using that token."""
    # NOTE: before ray is imported: Ray reads its authentication settings once, at import.
    os.environ.update(_RAY_ENV)
    if token_path is not None:
        os.environ.update(token_env(token_path))
    import ray
    import ray.serve  # NOTE: importing it sets its logger to INFO, on stderr

    # the commands print their own summary: Ray's INFO lines ("Started Serve in namespace ...")
    # are noise on a terminal and in anything that parses the output
    for name in _RAY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address=address, namespace="loraplex", logging_level="WARNING", log_to_driver=False)
