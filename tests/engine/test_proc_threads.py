"""Thread states from Linux ``/proc``: a running process has a runnable thread, a stopped one
(SIGSTOP) has none, an exited one has no threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loraplex.engine.transport.proc_threads import any_thread_runnable, thread_states

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")


def test_this_process_reading_proc_is_runnable() -> None:
    assert any_thread_runnable(os.getpid())  # the thread reading is on a CPU


def test_a_stopped_process_has_no_runnable_thread_and_an_exited_one_no_threads() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.kill(spin.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while set(thread_states(spin.pid)) != {"T"} and time.monotonic() < deadline:
            time.sleep(0.01)  # the stop is delivered asynchronously
        assert set(thread_states(spin.pid)) == {"T"}
        assert not any_thread_runnable(spin.pid)
        os.kill(spin.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while not any_thread_runnable(spin.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any_thread_runnable(spin.pid)  # a busy loop: on a CPU or waiting for one
    finally:
        spin.kill()
        spin.wait()
    assert thread_states(spin.pid) == [] and not any_thread_runnable(spin.pid)


def test_states_are_read_after_the_last_parenthesis_of_the_name(tmp_path: Path) -> None:
    task = tmp_path / "7" / "task" / "7"
    task.mkdir(parents=True)
    (task / "stat").write_bytes(b"7 (a) b) T 1 7 7 0 -1")  # a thread named "a) b"
    assert thread_states(7, tmp_path) == ["T"] and not any_thread_runnable(7, tmp_path)
