"""The server raises its soft RLIMIT_NOFILE to what its connection caps need, and refuses to
start when the hard limit is too low (each case in a child process: limits are per process and
a lowered hard limit cannot be raised again)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from pathlib import Path

from loraplex.server.connections import MAX_WAITING
from loraplex.server.fd_limit import RESERVED_FDS, needed_fds
from loraplex.server.tarpit import MAX_HELD

HELD = MAX_HELD + MAX_WAITING  # connections held off or waiting for room


def run_child(soft: int, hard: int, max_connections: int) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
        from loraplex.server.listeners import ConnectionLimits, ListenerConfig
        try:
            ListenerConfig(object(), ConnectionLimits(max_connections={max_connections}))
        except ValueError as exc:
            print("refused:", exc)
        print("soft:", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )


def test_a_low_soft_limit_is_raised_to_what_the_caps_need() -> None:
    needed = needed_fds(1024, HELD)
    assert needed == 1024 + HELD + RESERVED_FDS
    out = run_child(512, needed + 100, 1024).stdout
    assert "refused" not in out
    assert f"soft: {needed}" in out


def test_a_hard_limit_below_the_caps_refuses_to_start_naming_the_setting() -> None:
    out = run_child(512, 1500, 1024).stdout
    assert "refused: max_connections 1024 is invalid here" in out
    assert "hard RLIMIT_NOFILE is 1500" in out
    assert "soft: 512" in out  # nothing changed
    fits = run_child(512, 1500, 1500 - HELD - RESERVED_FDS).stdout
    assert "refused" not in fits and "soft: 1500" in fits


def test_serve_refuses_before_building_anything(tmp_path: Path) -> None:
    def low_hard_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 1500))

    done = subprocess.run(
        [sys.executable, "-m", "loraplex", "serve", "--data-dir", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=low_hard_limit,
        check=False,
    )
    assert done.returncode == 1
    assert "error: max_connections 1024 is invalid here" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing was built in the data dir
