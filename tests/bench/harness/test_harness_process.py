"""bench/harness/process.py: a real child server (Python's http.server) launched, waited for,
stopped with its whole process group, and its log kept."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loraplex.bench.harness.process import (
    Launch,
    free_port,
    fresh_run_dir,
    module_command,
    serve_command,
    serving_process,
)

# A server that also leaves a grandchild behind in its process group: the stop must end both.
_SERVER = (
    "import http.server, subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('grandchild', child.pid, flush=True)\n"
    "http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, "
    "port=int(sys.argv[1]), bind='127.0.0.1')\n"
)


def _launch(tmp_path: Path, command: list[str], port: int, timeout_s: float = 30.0) -> Launch:
    return Launch(
        name="test server",
        command=command,
        env=dict(os.environ),
        url=f"http://127.0.0.1:{port}",
        ready_path="/",
        log_path=tmp_path / "logs" / "server.log",
        start_timeout_s=timeout_s,
        stop_grace_s=10.0,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_command_runs_loraplex_serve_with_its_arguments() -> None:
    """The one command line the benchmarks and qualify start their servers with."""
    command = serve_command("--help")
    assert command[0] == sys.executable and command[-2:] == ["serve", "--help"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout and "serve" in done.stdout and "--data-dir" in done.stdout


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_serving_process_waits_stops_the_group_and_keeps_the_log(tmp_path: Path) -> None:
    port = free_port()
    launch = _launch(tmp_path, [sys.executable, "-c", _SERVER, str(port)], port)
    with serving_process(launch) as process:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # ready means it answers
        group = os.getpgid(process.pid)
        assert group == process.pid  # a session of its own, not the test's group
        text = launch.log_path.read_text()
        grandchild = int(text.split("grandchild ")[1].split()[0])
        assert _alive(grandchild)
    assert process.poll() is not None
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL is delivered asynchronously; a zombie is reaped by init
    with pytest.raises(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)  # nothing of the group is left
    assert "grandchild" in launch.log_path.read_text()  # the log outlives the server


def test_early_exit_quotes_the_log(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)"]
    match = r"test server exited with 3:\n.*bad flag --x"
    with (
        pytest.raises(RuntimeError, match=match),
        serving_process(_launch(tmp_path, command, port)),
    ):
        pass


def test_never_ready_names_the_log(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    launch = _launch(tmp_path, command, port, timeout_s=0.5)
    match = r"did not become ready within 0\.5 s"
    with pytest.raises(RuntimeError, match=match), serving_process(launch) as process:
        pytest.fail(f"yielded a server that never answered: {process.pid}")
    assert launch.log_path.exists()


def test_launch_refuses_bad_bounds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="start_timeout_s 0"):
        Launch("x", ["true"], {}, "http://h", "/", tmp_path / "l", 0, 1.0)
    with pytest.raises(ValueError, match="ready_path 'ready'"):
        Launch("x", ["true"], {}, "http://h", "ready", tmp_path / "l", 1.0, 1.0)


def test_fresh_run_dir_never_reuses_one(tmp_path: Path) -> None:
    first = fresh_run_dir(tmp_path / "peer", "20260101T000000Z")
    second = fresh_run_dir(tmp_path / "peer", "20260101T000000Z")
    assert first.name == "20260101T000000Z" and second.name == "20260101T000000Z-2"
    assert first.is_dir() and second.is_dir()


_SLEEPER = "import time; time.sleep(60)"


def _started_and_armed(command: list[str]) -> subprocess.Popen[bytes]:
    """``command`` started, returned once its first lines ran (it said so): a thread that ends
    before the child's prctl has passed on no signal, as ``serving_process``'s waits."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"armed\n"
    return child


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_that_dies_with_its_parent_dies_with_the_thread_that_started_it() -> None:
    """Why ``serving_process`` refuses other threads: Linux's PR_SET_PDEATHSIG fires when the
    thread that forked the child ends. Started from the main thread, the child lives on."""
    command = module_command(sys.executable, "this_module_is_never_reached")
    first_lines = command[2].split("import runpy")[0]
    command[2] = first_lines + "print('armed', flush=True); " + _SLEEPER
    started: list[subprocess.Popen[bytes]] = []
    worker = threading.Thread(target=lambda: started.append(_started_and_armed(command)))
    worker.start()
    worker.join()
    survivor = _started_and_armed(command)  # from this, the main thread, which outlives it
    try:
        assert started[0].wait(timeout=60) == -signal.SIGTERM  # killed as its thread ended
        assert survivor.poll() is None
    finally:
        for child in (*started, survivor):
            child.kill()
            child.wait(timeout=10)


def test_a_launch_that_dies_with_its_parent_is_refused_off_the_main_thread(
    tmp_path: Path,
) -> None:
    port = free_port()
    refused: list[BaseException] = []

    def launch(command: list[str]) -> None:
        try:
            with serving_process(_launch(tmp_path, command, port, timeout_s=0.5)):
                pass
        except RuntimeError as exc:
            refused.append(exc)

    worker = threading.Thread(target=launch, args=(serve_command("--help"),), name="worker-1")
    worker.start()
    worker.join(timeout=60)
    assert len(refused) == 1 and "started from thread 'worker-1'" in str(refused[0])
    assert "start it from the main thread" in str(refused[0])
    assert not launch_path(tmp_path).exists()  # refused before anything was started
    other = threading.Thread(target=launch, args=([sys.executable, "-c", _SLEEPER],))
    other.start()  # a command that does not die with its parent: only not ready in time
    other.join(timeout=60)
    assert len(refused) == 2 and "did not become ready" in str(refused[1])


def launch_path(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "server.log"
