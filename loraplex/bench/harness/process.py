"""One server process's lifecycle for a benchmark: a free port, the launch with its output in a
log file the caller keeps, the wait until an HTTP path answers 200, and the stop of its whole
process group.

Every benchmark that runs a server (``loraplex serve``, vLLM) goes through ``serving_process``,
so the readiness rule, the stop sequence and where the logs go are the same on every side.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_POLL_S = 0.2  # how often the readiness path is asked while a server starts


@dataclass(frozen=True)
class Launch:
    """How to start one server and how to know it is ready."""

    name: str  # the server's name in errors ("loraplex serve", "vLLM")
    command: Sequence[str]  # argv
    env: Mapping[str, str]  # its whole environment
    url: str  # its base URL, e.g. http://127.0.0.1:8000
    ready_path: str  # answers 200 once the server takes requests, e.g. /ready
    log_path: Path  # stdout and stderr; kept after the stop
    start_timeout_s: float  # bound on start to ready
    stop_grace_s: float  # after SIGINT, before SIGKILL
    tail_chars: int = 2000  # of the log, quoted when the server exits early
    poll_s: float = READY_POLL_S  # how often the ready path is asked (the timing's resolution)

    def __post_init__(self) -> None:
        for name in ("start_timeout_s", "stop_grace_s", "poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if not self.ready_path.startswith("/"):
            raise ValueError(f"ready_path {self.ready_path!r} is invalid; expected a /path")


OWN_PREFIX = "LORAPLEX_"  # the variables serve reads (data dir, database, store, admin key...)


def own_env(**extra: str) -> dict[str, str]:
    """This process's environment for a ``loraplex serve`` of its own, less every
    ``LORAPLEX_*`` variable, plus ``extra``. NOTE: serve's variables win over its config file,
    so a server written a config of its own and started in an operator's shell (say with
    ``LORAPLEX_DATA_DIR`` exported, as the docs show) opened the operator's registry instead:
    ``qualify``'s comparator servers issued their key in one registry and served another
    (every request a 401), and a ``LORAPLEX_DATABASE_URL`` would have had them write to the
    deployment's own database."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(OWN_PREFIX)}
    return {**kept, **extra}


# A child's first lines: ask Linux (prctl PR_SET_PDEATHSIG) to SIGTERM it when the process that
# started it dies, so no server outlives a killed benchmark or qualify run; elsewhere a no-op.
# NOTE: Linux sends it when the *thread* that forked the child ends, not the process: a child
# started from a worker thread (``asyncio.to_thread``, a ``ThreadPoolExecutor``) is killed
# when that thread exits after the child's first lines ran (``serving_process`` waits for
# ready, so always), in the middle of the benchmark. Every caller starts its server from
# its main thread (``serving_process``, in ``bench serve``, ``bench peer``, ``bench front``,
# ``qualify``'s comparators and self-served deployment), and ``serving_process`` refuses a
# launch of these commands from any other thread (``tests/bench/harness``).
_DIE_WITH_PARENT = (
    "import ctypes, signal, sys\n"
    "if sys.platform == 'linux':\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
)
_SERVE = _DIE_WITH_PARENT + "from loraplex.cli import main; main()"
# ``python -m MODULE ARGS`` after those lines: the module's name is argv[1], taken off before it
# runs (it sees the argv ``-m`` gives it)
_MODULE = (
    _DIE_WITH_PARENT
    + "import runpy; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


def serve_command(*args: str) -> list[str]:
    """The command line of a ``loraplex serve`` child with ``args`` that dies with its parent."""
    return [sys.executable, "-c", _SERVE, "serve", *args]


def module_command(python: str, module: str, *args: str) -> list[str]:
    """``python -m module args`` as a child that dies with its parent (another interpreter's
    module, such as vLLM's server: ``serve_command`` imports loraplex)."""
    return [python, "-c", _MODULE, module, *args]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serving_process(launch: Launch) -> Iterator[subprocess.Popen[bytes]]:
    """Runs ``launch`` in a session of its own until the block ends; yields the process once
    its ready path answers 200. The log stays at ``launch.log_path``. A command that dies with
    its parent (``serve_command``, ``module_command``) is started from the main thread only:
    from another, RuntimeError (it would die with that thread, see ``_DIE_WITH_PARENT``)."""
    dies_with_parent = any(_DIE_WITH_PARENT in arg for arg in launch.command)
    if dies_with_parent and threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"{launch.name} is started from thread {threading.current_thread().name!r}: start "
            "it from the main thread (Linux's PR_SET_PDEATHSIG would SIGTERM it when this "
            "thread ends, not when the benchmark does)"
        )
    launch.log_path.parent.mkdir(parents=True, exist_ok=True)
    with launch.log_path.open("wb") as log:
        process = subprocess.Popen(
            list(launch.command),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(launch.env),
            start_new_session=True,
        )
        try:
            wait_ready(process, launch)
            yield process
        finally:
            stop_group(process, launch.stop_grace_s)


def wait_ready(process: subprocess.Popen[bytes], launch: Launch) -> None:
    """Returns once ``launch.ready_path`` answers 200; RuntimeError quoting the log's tail when
    the process exits first, RuntimeError naming the log when the bound passes."""
    deadline = time.monotonic() + launch.start_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = launch.log_path.read_text(encoding="utf-8", errors="replace")
            tail = text[-launch.tail_chars :]
            raise RuntimeError(f"{launch.name} exited with {process.returncode}:\n{tail}")
        try:
            if httpx.get(launch.url + launch.ready_path, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(launch.poll_s)
    raise RuntimeError(
        f"{launch.name} did not become ready within {launch.start_timeout_s} s "
        f"(log: {launch.log_path})"
    )


def stop_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGINT to the server, which stops its own children in order; SIGKILL when it has not
    exited after ``grace_s``; then SIGKILL to whatever of its process group is left (signalling
    the whole group at once would interrupt the children in the middle of the parent's orderly
    shutdown)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=grace_s)
    with suppress(ProcessLookupError):  # a child its parent left behind
        os.killpg(process.pid, signal.SIGKILL)


def fresh_run_dir(parent: Path, stamp: str) -> Path:
    """A new, empty directory ``parent/stamp`` (``stamp-2``, ``-3``... when taken) for one
    benchmark invocation's server logs and data, kept after the run so what each server was
    configured with and said can be checked."""
    for attempt in range(1, 1000):
        path = parent / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        return path
    raise RuntimeError(f"no free run directory under {parent} for {stamp}")
