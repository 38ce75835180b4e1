"""The engine child started ahead of its build (``loraplex serve`` starts it before it imports
its HTTP side): it imports its preload at once, builds what it is told later and serves; a
preload that fails is the first start's error; a child never told to build is killed and reaped;
it is forked only while no other thread runs; ``build_server`` kills a child it cannot use."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import ADMIN_KEY
from prespawn_engine import (
    PRELOAD,
    ahead_worker,
    failing_ahead,
    preloaded_worker,
    record_ahead,
)

from loraplex.demo.assets import DemoAssets
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.transport.process import EngineProcess
from loraplex.engine.transport.process_link import ChildLink
from loraplex.model.tokenizer import TextTokenizer
from loraplex.sampling import SamplingParams
from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _config(demo_assets: DemoAssets, data_dir: Path, **values: object) -> ServeConfig:
    data_dir.mkdir(parents=True, exist_ok=True)
    fields = {"model": demo_assets.base_model_dir, **values}
    return ServeConfig(
        data_dir=data_dir, demo=False, admin_key=ADMIN_KEY, torch_threads=1,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _generate(engine: EngineProcess) -> list[int]:
    ids = tuple(engine.tokenizer.encode("The acme support team"))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    deltas = [d async for d in engine.generate(EngineRequest("r1", "acme", None, ids, params))]
    return [t for d in deltas for t in d.token_ids]


def test_a_child_started_ahead_imports_its_preload_then_builds_and_serves(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    child = ChildLink((PRELOAD,))
    time.sleep(0.5)  # the parent goes on with its own start meanwhile
    config = _config(demo_assets, tmp_path / "data")
    engine = EngineProcess(
        preloaded_worker, (config, demo_assets.base_model_dir),
        TextTokenizer(demo_assets.base_model_dir), wait_ready=False, preload=(PRELOAD,),
        child=child,
    )  # fmt: skip
    try:
        engine.wait_started(300)
        assert engine.pid == child.pid  # the child started ahead is the engine
        assert len(asyncio.run(_generate(engine))) == 4
    finally:
        engine.shutdown()
    assert not _alive(child.pid or 0)


def test_a_preload_that_fails_is_the_first_starts_error_and_no_child_is_left(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    config = _config(demo_assets, tmp_path / "data")
    engine = EngineProcess(
        preloaded_worker, (config, demo_assets.base_model_dir),
        TextTokenizer(demo_assets.base_model_dir), wait_ready=False,
        preload=("loraplex_no_such_module",),
    )  # fmt: skip
    try:
        with pytest.raises(Exception, match="loraplex_no_such_module"):
            engine.wait_started(300)
        assert engine.health().num_restarts == 0  # not retried
        assert not _alive(engine.pid or 0)
    finally:
        engine.shutdown()


def test_the_ahead_call_runs_in_the_child_before_its_preload_and_its_build() -> None:
    """A spawned child (a fork would have this process's modules, the preload perhaps too)."""
    mark = uuid.uuid4().hex
    child = ChildLink((PRELOAD,), ahead=(record_ahead, (mark,)))
    child.build(ahead_worker, (), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="ahead seen") as raised:
        child.await_ready(300, threading.Event())
    assert f"['{mark}, preload before: False'], preload after: True" in str(raised.value)
    assert not _alive(child.pid or 0)


def test_an_ahead_call_that_fails_is_the_first_starts_error() -> None:
    child = ChildLink((PRELOAD,), ahead=(failing_ahead, ("x1",)))
    child.build(ahead_worker, (), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="ahead x1 is invalid"):
        child.await_ready(300, threading.Event())
    assert not _alive(child.pid or 0)


def test_the_engine_child_is_named_the_model_only_when_one_is_configured(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spawn_engine_child(settings)``: ``engine_ahead`` with the configured model; none for
    the demo set, whose directory the child learns from its Build."""
    from loraplex.serve import worker

    made: list[object] = []
    monkeypatch.setattr(worker, "ChildLink", lambda *a, **k: made.append(k.get("ahead")))
    configured = _config(demo_assets, tmp_path / "a")
    worker.spawn_engine_child(configured)
    worker.spawn_engine_child(_config(demo_assets, tmp_path / "b", model=None))
    worker.spawn_engine_child()
    assert made == [(worker.engine_ahead, (configured, demo_assets.base_model_dir)), None, None]


def test_a_child_never_told_to_build_is_killed_and_reaped() -> None:
    child = ChildLink((PRELOAD,))
    assert child.pid is not None and _alive(child.pid)
    child.kill()
    child.close()
    assert not _alive(child.pid)
    with pytest.raises(ValueError, match="pipe is closed"):
        child.build(preloaded_worker, (), (1.0, 1.0, 1.0))


def test_a_fork_is_refused_while_another_thread_runs() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with pytest.raises(ValueError, match="fork is invalid with threads running"):
            ChildLink((PRELOAD,), fork=True)
    finally:
        stop.set()
        thread.join()


# In a fresh interpreter (pytest's may run threads): the first engine child is forked, and sees
# what its parent set before; once a thread runs, the next one is spawned and does not.
_FORK_OR_SPAWN = """
import colorsys, threading, sys
from loraplex.engine.transport.process_link import ChildLink
from loraplex.serve.worker import spawn_engine_child
from prespawn_engine import mark_worker

colorsys.loraplex_mark = sys.argv[1]

def seen(child: ChildLink) -> str:
    child.build(mark_worker, (sys.argv[1],), (1.0, 1.0, 1.0))
    try:
        child.await_ready(300, threading.Event())
    except Exception as exc:
        return str(exc)
    return "built"

print(seen(spawn_engine_child()))
threading.Thread(target=threading.Event().wait, daemon=True).start()
print(seen(spawn_engine_child()))
"""


def test_the_first_engine_child_is_forked_and_later_ones_spawned() -> None:
    tests_dir = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests_dir, *sys.path])}
    run = subprocess.run(
        [sys.executable, "-c", _FORK_OR_SPAWN, uuid.uuid4().hex],
        capture_output=True, text=True, timeout=600, check=True, env=env,
    )  # fmt: skip
    assert run.stdout.split("\n")[:2] == ["mark seen: True", "mark seen: False"], run.stderr


def test_build_server_kills_an_engine_child_it_cannot_use(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    threaded = ChildLink((PRELOAD,))
    config = _config(demo_assets, tmp_path / "a", engine_process=False)
    with pytest.raises(ValueError, match="engine_child is invalid"):
        build_server(config, engine_child=threaded)
    assert not _alive(threaded.pid or 0)

    orphan = ChildLink((PRELOAD,))
    missing = _config(demo_assets, tmp_path / "b", model=tmp_path / "no-model")
    with pytest.raises(Exception, match="no-model"):
        build_server(missing, wait_engine=False, engine_child=orphan)
    assert not _alive(orphan.pid or 0)


def test_serve_that_cannot_listen_leaves_no_engine_child(tmp_path: Path) -> None:
    """The child started before the bind is killed when the port is taken (found by a mark in
    its environment: a fork has its parent's command line)."""
    import socket

    mark = uuid.uuid4().hex
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "loraplex", "serve", "--data-dir", str(tmp_path),
             "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "LORAPLEX_TEST_MARK": mark},
        )  # fmt: skip
    assert done.returncode == 1 and "error: cannot listen" in done.stderr, done.stderr
    assert not _marked(mark)


def _marked(mark: str) -> list[int]:
    """Live processes whose environment holds ``mark``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if mark.encode() in environ and _alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


_DIES_UNCLEANLY = """
import os, sys
from loraplex.engine.transport.process_link import ChildLink
child = ChildLink(("colorsys",), fork=True)
print(child.pid, flush=True)
sys.stdin.readline()  # the test reads the pid, then lets this process die
os._exit(0)  # no close, no kill: as after SIGKILL
"""


def test_a_forked_child_exits_when_its_parent_dies_without_cleanup() -> None:
    # The fork inherits the parent's end of the pipe; unless the child closes it, the pipe never
    # reaches EOF in the child and an orphaned engine runs on (found after a killed benchmark).
    parent = subprocess.Popen(
        [sys.executable, "-c", _DIES_UNCLEANLY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None and parent.stdin is not None
    pid = int(parent.stdout.readline())
    assert _alive(pid)
    parent.stdin.write("\n")
    parent.stdin.flush()
    assert parent.wait(30) == 0
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphaned = _alive(pid)
    if orphaned:
        os.kill(pid, 9)
    assert not orphaned, "the forked engine child outlived its parent"


def _ignored_signals(pid: int) -> int:
    """The child's ignored-signal mask (``SigIgn`` of /proc/PID/status; 0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(
        next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
    )


def test_sigterm_to_the_process_group_leaves_the_child_to_its_parent() -> None:
    """A SIGTERM (or Ctrl-C's SIGINT) to the whole group killed the child before the server
    knew it was shutting down: the log said "killed by SIGTERM; restarting it" and a new child
    started. The child now ignores both; its parent's Stop ends it (exit code 0, not -15)."""
    child = ChildLink(())
    assert child.pid is not None
    wanted = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))
    deadline = time.monotonic() + 120.0  # a spawned interpreter's start on a loaded machine
    while _ignored_signals(child.pid) & wanted != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ignored_signals(child.pid) & wanted == wanted
    os.kill(child.pid, signal.SIGTERM)
    os.kill(child.pid, signal.SIGINT)
    child.request_stop()
    child.close(grace_s=120.0)
    assert child.exitcode == 0
