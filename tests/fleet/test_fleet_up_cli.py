"""What ``fleet up`` does before and after Ray: a port another fleet holds (the API's or the admin
socket's) is refused before any key is issued (Ray's proxy sets SO_REUSEPORT, so a second fleet used
to bind it too and get half its connections), keys issued for a fleet that then failed are still
printed, and an unusable data directory is one line, not a traceback."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.fleet import control, ray_cluster
from loraplex.fleet.settings import FleetSettings
from loraplex.serve.config import ServeConfig


class Recorder:
    """``control.prepare`` and ``control.up`` replaced; ``up`` fails like a fleet not ready."""

    def __init__(self, model_dir: Path, keys: dict[str, str]) -> None:
        self.model_dir = model_dir
        self.keys = keys
        self.prepared: list[ServeConfig] = []
        self.started: list[FleetSettings] = []

    def prepare(self, config: ServeConfig, replicas_here: int | None = None) -> control.Prepared:
        self.prepared.append(config)
        return control.Prepared(self.model_dir, "the-admin-key", True, dict(self.keys))

    def up(self, settings: FleetSettings, address: str | None, **_: Any) -> control.FleetRecord:
        self.started.append(settings)
        raise RuntimeError("the fleet at http://127.0.0.1:1 was not ready within 1 s")


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Recorder:
    fake = Recorder(tmp_path, {"acme": "acme-secret-key"})
    monkeypatch.setattr(control, "prepare", fake.prepare)
    monkeypatch.setattr(control, "up", fake.up)
    return fake


@pytest.fixture
def reuseport_listener() -> Iterator[int]:
    """A port held as Ray Serve's proxy holds it: listening, with SO_REUSEPORT."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _up(data_dir: Path, *args: str) -> Any:
    return CliRunner().invoke(app, ["fleet", "up", "--data-dir", str(data_dir), *args])


def test_a_port_another_fleet_holds_is_refused_before_keys_are_issued(
    tmp_path: Path, recorder: Recorder, reuseport_listener: int
) -> None:
    result = _up(tmp_path / "data", "--port", str(reuseport_listener))
    assert result.exit_code == 1, result.output
    assert f"cannot listen on 127.0.0.1:{reuseport_listener}" in result.output
    assert recorder.prepared == [] and recorder.started == []


def test_an_admin_port_held_is_refused_before_keys_are_issued(
    tmp_path: Path, recorder: Recorder, reuseport_listener: int
) -> None:
    """The ingress's listener binds the admin socket too (``admin_port``), as ``serve`` does."""
    config = tmp_path / "fleet.toml"
    config.write_text(f"[serve]\nadmin_port = {reuseport_listener}\n")
    result = _up(tmp_path / "data", "--port", "0", "--config", str(config))
    assert result.exit_code == 1, result.output
    assert f"and admin port {reuseport_listener}" in result.output
    assert recorder.prepared == [] and recorder.started == []


def test_keys_issued_for_a_fleet_that_failed_are_printed(
    tmp_path: Path, recorder: Recorder
) -> None:
    result = _up(tmp_path / "data", "--port", "0")
    assert result.exit_code == 1, result.output
    assert len(recorder.started) == 1
    assert "the-admin-key" in result.output and "acme-secret-key" in result.output
    assert "was not ready within 1 s" in result.output


def test_an_unusable_data_dir_is_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = _up(not_a_dir, "--port", "0")
    assert result.exit_code == 2, result.output
    words = " ".join(result.output.replace("│", " ").split())  # a box around a wrapped line
    assert "it is not a directory" in words and "cannot use" in words
    assert not isinstance(result.exception, OSError)


def test_a_local_head_has_a_loopback_node_address_and_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    def popen(command: list[str], **_: Any) -> Any:
        commands.append(command)
        raise OSError("not started in a test")

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(ray_cluster, "ray_executable", lambda: "ray")
    with pytest.raises(OSError, match="not started"):
        ray_cluster.start_local_cluster(tmp_path / "log", tmp_path / "token")
    (command,) = commands
    assert "--node-ip-address=127.0.0.1" in command
    # not Ray's 10001, which every head took with SO_REUSEPORT (two fleets shared it)
    (client_port,) = [a for a in command if a.startswith("--ray-client-server-port=")]
    assert client_port != "--ray-client-server-port=10001"
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600


def test_a_command_connected_to_ray_prints_no_ray_info_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fleet status`` printed Ray Serve's "INFO ... Started <...LongPollClient>" on stderr."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve")  # as a command does: its import sets its logger to INFO

    monkeypatch.setattr(ray, "init", lambda **_: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    ray_cluster.connect("127.0.0.1:1")
    # NOTE: levels, not captured text: Ray's handler holds whichever stderr was current when
    # ray.serve was first imported in this test process
    for name in ("ray", "ray.serve"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name


def test_a_restart_says_where_the_keys_are_as_serve_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A second ``up`` on a data dir issues no key: it said nothing about them (``serve`` says
    where the admin key is kept and how to get a tenant key)."""
    record = control.FleetRecord("127.0.0.1:1", True, None, None, "http://127.0.0.1:8000", 2)
    prepared = control.Prepared(tmp_path, "old-admin-key", False, {})
    monkeypatch.setattr(control, "prepare", lambda config, replicas_here: prepared)
    monkeypatch.setattr(control, "up", lambda settings, address, **_: record)
    with socket.socket() as sock:  # a free port for the admin socket
        sock.bind(("127.0.0.1", 0))
        admin_port = sock.getsockname()[1]
    config = tmp_path / "fleet.toml"
    config.write_text(f"[serve]\nadmin_port = {admin_port}\n")
    result = _up(tmp_path / "data", "--port", "0", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert f"/metrics only on http://127.0.0.1:{admin_port}" in result.output
    assert f"kept in {tmp_path / 'data' / 'admin-key'}" in result.output
    assert "old-admin-key" not in result.output
    assert (
        f"`loraplex keys create TENANT --data-dir {tmp_path / 'data'}` makes one" in result.output
    )


def test_fewer_cpu_loras_than_gpu_slots_is_refused_before_keys_are_issued(
    tmp_path: Path, recorder: Recorder
) -> None:
    """vLLM's rule, as ``serve`` applies it: ``max_cpu_loras`` (a ``[serve]`` key here) below
    ``--max-loras`` was taken."""
    path = tmp_path / "fleet.toml"
    path.write_text("[serve]\nmax_cpu_loras = 2\n", encoding="utf-8")
    result = _up(tmp_path / "data", "--config", str(path), "--max-loras", "4")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())
    assert "max_cpu_loras 2 is invalid with max_loras 4" in said, result.output
    assert recorder.prepared == [] and recorder.started == []
