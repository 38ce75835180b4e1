"""What ``fleet up``, ``fleet status`` and ``fleet down`` do with ``<data dir>/fleet.json``, found
by running a fleet as a new operator (docs/benchmarks/newfleet.md): a fleet whose Ray head died is
told apart from a running one before anything connects to it (a driver connecting to a GCS that
is gone retried for minutes, so ``status`` and ``down`` hung and ``up`` refused the data dir
for good), ``up`` on a data dir whose fleet runs is refused before any key, the hints name the
data directory, and ``status`` shows each replica's process and how many replicas were asked
for. No Ray cluster is started."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from fleet_fakes import status
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.fleet import control
from loraplex.fleet.board import FORGET_AFTER_S, BoardEntry
from loraplex.fleet.ray_cluster import free_port
from loraplex.fleet.settings import FleetSettings
from loraplex.fleet.state import replica_state
from loraplex.serve.config import ServeConfig
from loraplex.serve.program import program


def _closed_port() -> int:
    return free_port()  # bound and closed: nothing listens there


def _gone_process_group() -> int:
    """The id of a process group that no longer exists (a child that ran in its own)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait()
    return child.pid


@pytest.fixture
def gcs() -> Iterator[int]:
    """A port that accepts connections, as a live GCS does."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def no_connect(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``connect`` replaced: a dead cluster must not be connected to (it retried for minutes)."""
    calls: list[str] = []

    def connect(address: str, token_path: Path | None = None) -> None:
        calls.append(address)
        raise AssertionError(f"connected to {address}")

    monkeypatch.setattr(control, "connect", connect)
    return calls


@pytest.fixture
def not_default_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LORAPLEX_DATA_DIR", raising=False)


def _record(data_dir: Path, *, port: int, group: int | None) -> control.FleetRecord:
    record = control.FleetRecord(
        f"127.0.0.1:{port}", True, group, None, "http://127.0.0.1:18000", 2
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / control.STATE_FILE).write_text(json.dumps(asdict(record)), encoding="utf-8")
    return record


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, ["fleet", *args])


def _words(output: str) -> str:
    return " ".join(output.split())


def _recorded(tmp_path: Path, address: str) -> Path:
    """A data directory whose fleet record names a joined cluster at ``address``."""
    data = tmp_path / "data"
    record = control.FleetRecord(address, False, None, None, "http://x:1", 2)
    data.mkdir()
    (data / control.STATE_FILE).write_text(json.dumps(asdict(record)), encoding="utf-8")
    return data


def test_status_of_a_fleet_whose_ray_head_died_says_what_to_do(
    tmp_path: Path, no_connect: list[str], not_default_dir: None
) -> None:
    data = tmp_path / "data"
    _record(data, port=_closed_port(), group=_gone_process_group())
    result = _run("status", "--data-dir", str(data))
    assert result.exit_code == 1, result.output
    words = _words(result.output)
    assert "is not running: its Ray head (process group" in words
    assert f"`loraplex fleet down --data-dir {data}` clears the record" in words
    assert no_connect == []


def test_a_joined_cluster_that_does_not_answer_is_not_connected_to(
    tmp_path: Path, no_connect: list[str], not_default_dir: None
) -> None:
    data = tmp_path / "data"
    port = _closed_port()
    record = control.FleetRecord(f"127.0.0.1:{port}", False, None, None, "http://x:1", 2)
    reason = control.cluster_down_reason(record)
    assert reason is not None and f"127.0.0.1:{port} does not answer" in reason
    data.mkdir()
    (data / control.STATE_FILE).write_text(json.dumps(asdict(record)), encoding="utf-8")
    result = _run("down", "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    assert f"nothing was deleted on 127.0.0.1:{port}" in _words(result.output)
    assert no_connect == []


def test_status_of_a_cluster_whose_gcs_accepts_but_never_answers_gives_up_naming_the_flag(
    tmp_path: Path, gcs: int, not_default_dir: None
) -> None:
    # A stopped or hung GCS still accepts connections (the kernel does): the port probe passed,
    # and Ray's driver connect then waited without end, so `fleet status` hung.
    data = _recorded(tmp_path, f"127.0.0.1:{gcs}")
    result = _run("status", "--data-dir", str(data), "--timeout-s", "3")
    assert result.exit_code == 1, result.output
    words = _words(result.output)
    assert f"the fleet's Ray cluster at 127.0.0.1:{gcs} did not answer within 3 s" in words
    assert "(--timeout-s)" in words
    refused = _run("status", "--data-dir", str(data), "--timeout-s", "0")
    assert refused.exit_code == 1 and "--timeout-s 0 is invalid" in refused.output


def test_down_of_a_cluster_whose_gcs_accepts_but_never_answers_gives_up_naming_the_flag(
    tmp_path: Path, gcs: int, not_default_dir: None
) -> None:
    # `down` connected in this process as `status` did: the same silent GCS hung it too.
    data = _recorded(tmp_path, f"127.0.0.1:{gcs}")
    refused = _run("down", "--data-dir", str(data), "--timeout-s", "0")
    assert refused.exit_code == 1 and "--timeout-s 0 is invalid" in refused.output
    assert (data / control.STATE_FILE).exists()  # a refused flag removes nothing
    result = _run("down", "--data-dir", str(data), "--timeout-s", "3")
    assert result.exit_code == 1, result.output
    words = _words(result.output)
    assert f"the fleet's Ray cluster at 127.0.0.1:{gcs} did not answer within 3 s" in words
    assert "(--timeout-s)" in words
    assert (
        "its record is removed; the application 'loraplex' may still be deployed on "
        f"127.0.0.1:{gcs}" in words
    )
    assert not (data / control.STATE_FILE).exists()


def test_down_of_a_fleet_whose_ray_head_died_removes_its_record_and_replica_caches(
    tmp_path: Path,
    no_connect: list[str],
    monkeypatch: pytest.MonkeyPatch,
    not_default_dir: None,
) -> None:
    data = tmp_path / "data"
    _record(data, port=_closed_port(), group=_gone_process_group())
    leftover = data / control.REPLICAS_DIR / "81cu0i73"  # a replica that was killed
    leftover.mkdir(parents=True)
    (leftover / "blob").write_bytes(b"x")
    stopped_groups: list[int] = []
    monkeypatch.setattr(control, "stop_local_cluster", stopped_groups.append)
    result = _run("down", "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    assert "was not running" in result.output and "its record is removed" in result.output
    assert not (data / control.STATE_FILE).exists()
    assert not (data / control.REPLICAS_DIR).exists()
    # NOTE: a group whose head is gone is not signalled: after a restart its id may be reused
    assert stopped_groups == [] and no_connect == []


class Recorder:
    def __init__(self, tmp_path: Path, prepared: control.Prepared) -> None:
        self.tmp_path = tmp_path
        self.prepared_for: list[ServeConfig] = []
        self.result = prepared

    def prepare(self, config: ServeConfig, replicas_here: int | None = None) -> control.Prepared:
        self.prepared_for.append(config)
        return self.result


def _recorder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, new_keys: bool = True
) -> Recorder:
    keys = {"acme": "acme-secret-key"} if new_keys else {}
    recorder = Recorder(tmp_path, control.Prepared(tmp_path, "admin-secret", new_keys, keys))
    monkeypatch.setattr(control, "prepare", recorder.prepare)
    return recorder


def test_up_on_a_data_dir_whose_fleet_runs_is_refused_before_any_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gcs: int, not_default_dir: None
) -> None:
    """It was refused only after ``prepare`` (the registry opened, keys issued when new), with
    "run fleet down first" about a fleet that was serving."""
    recorder = _recorder(monkeypatch, tmp_path)
    data = tmp_path / "data"
    _record(data, port=gcs, group=os.getpgid(0))
    result = _run("up", "--data-dir", str(data), "--port", "0")
    assert result.exit_code == 1, result.output
    words = _words(result.output)
    assert "already runs at http://127.0.0.1:18000" in words
    assert f"`loraplex fleet status --data-dir {data}` shows it" in words
    assert recorder.prepared_for == []


def test_up_on_a_data_dir_whose_fleet_died_says_how_to_clear_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_connect: list[str], not_default_dir: None
) -> None:
    recorder = _recorder(monkeypatch, tmp_path)
    data = tmp_path / "data"
    _record(data, port=_closed_port(), group=_gone_process_group())
    result = _run("up", "--data-dir", str(data), "--port", "0")
    assert result.exit_code == 1, result.output
    words = _words(result.output)
    assert "is recorded in" in words and "but is not running" in words
    assert f"`loraplex fleet down --data-dir {data}` clears the record" in words
    assert recorder.prepared_for == [] and no_connect == []


def test_a_failed_up_that_issued_no_key_does_not_announce_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart issues no key: its failure said "the keys issued for it stay valid:" above
    two lines saying none was issued."""
    _recorder(monkeypatch, tmp_path, new_keys=False)

    def up(settings: FleetSettings, address: str | None, **_: Any) -> control.FleetRecord:
        raise RuntimeError("the fleet at http://127.0.0.1:1 was not ready within 1 s")

    monkeypatch.setattr(control, "up", up)
    result = _run("up", "--data-dir", str(tmp_path / "data"), "--port", "0")
    assert result.exit_code == 1, result.output
    assert "no key was issued" in result.output
    assert "stay valid" not in result.output


def test_up_names_the_data_dir_in_its_hints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, not_default_dir: None
) -> None:
    """``up --data-dir D`` said "stop it with: loraplex fleet down", which found no fleet."""
    _recorder(monkeypatch, tmp_path, new_keys=False)
    record = control.FleetRecord("127.0.0.1:1", True, None, None, "http://127.0.0.1:18000", 2)
    monkeypatch.setattr(control, "up", lambda settings, address, **_: record)
    data = tmp_path / "data"
    result = _run("up", "--data-dir", str(data), "--port", "0")
    assert result.exit_code == 0, result.output
    assert f"loraplex fleet down --data-dir {data}" in result.output
    assert f"loraplex fleet status --data-dir {data}" in result.output


def test_the_default_data_dir_needs_no_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LORAPLEX_DATA_DIR", str(tmp_path))
    assert control.fleet_command("down", tmp_path) == "loraplex fleet down"
    spaced = tmp_path / "a b"
    assert control.fleet_command("down", spaced) == f"loraplex fleet down --data-dir '{spaced}'"


def _full_status(replica_id: str, pid: int) -> dict[str, Any]:
    tier = {"count": 1, "used_bytes": 10, "capacity_bytes": 100, "tenant_default_max_bytes": 50}
    return {
        **status(replica_id),
        "pid": pid,
        "tiers": {name: dict(tier) for name in ("l0", "l1", "l2")},
        "hits": {"l0": 1, "l1": 0, "l2": 0, "miss": 0},
    }


def test_status_shows_each_replica_pid_and_the_replicas_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gcs: int
) -> None:
    """A killed replica stays on the board (stale) beside its replacement until forgotten: the
    headline said "3 engine replicas" of a fleet of 2, and no line said which process was which
    replica (the board had each pid)."""
    data = tmp_path / "data"
    _record(data, port=gcs, group=None)
    entries = [
        BoardEntry("live", _full_status("live", 4242), 0.1, 3.0),
        BoardEntry("killed", _full_status("killed", 4243), 20.0, 3.0),
        BoardEntry("new", _full_status("new", 4244), 0.2, 3.0),
    ]
    monkeypatch.setattr(control, "board_entries", lambda record, data_dir, timeout_s: entries)
    result = _run("status", "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    assert "2 engine replicas asked for, 3 on the board, 2 healthy" in result.output
    assert " 4243 " in result.output and "gone" in result.output
    as_json = json.loads(_run("status", "--data-dir", str(data), "--json").output)
    assert [r["pid"] for r in as_json["replicas"]] == [4242, 4243, 4244]
    assert as_json["engine_replicas"] == 2


def test_a_stale_replica_may_be_gone_and_says_when_it_is_dropped() -> None:
    reason = BoardEntry("r", {"healthy": True}, 20.0, 3.0).down_reason
    assert reason is not None and "gone (Ray Serve replaces one that died)" in reason
    assert f"dropped from the board after {FORGET_AFTER_S:g} s" in reason


def test_the_headline_counts_healthy_replicas() -> None:
    from loraplex.cli.fleet import status_headline

    record = control.FleetRecord("127.0.0.1:1", True, None, None, "http://h:1", 2)
    states = [replica_state(BoardEntry("a", _full_status("a", 1), 0.0, 3.0))]
    assert status_headline(record, states) == (
        "fleet at http://h:1: 2 engine replicas asked for, 1 on the board, 1 healthy"
    )


def test_down_of_a_cluster_that_runs_no_serve_instance_has_nothing_to_delete(
    tmp_path: Path, not_default_dir: None
) -> None:
    # A Ray head that never ran Serve: `serve.delete` raised "There is no Serve instance running
    # on this Ray cluster." and `down` exited 1 with it, leaving the head and the record behind.
    from loraplex.fleet.ray_cluster import start_local_cluster, stop_local_cluster

    data = tmp_path / "data"
    data.mkdir()
    token = data / control.RAY_TOKEN
    address, group = start_local_cluster(data / control.RAY_LOG, token)
    try:
        record = control.FleetRecord(address, True, group, str(token), "http://x:1", 2)
        (data / control.STATE_FILE).write_text(json.dumps(asdict(record)), encoding="utf-8")
        result = _run("down", "--data-dir", str(data))
    finally:
        stop_local_cluster(group)  # a no-op once `down` stopped it
    assert result.exit_code == 0, result.output
    words = _words(result.output)
    assert f"no Serve instance runs on {address}, nothing to delete" in words
    assert "its record is removed and stopped its Ray head" in words
    assert not (data / control.STATE_FILE).exists()


def test_a_replica_names_the_file_its_log_lines_go_to(tmp_path: Path) -> None:
    """A replica's ``loraplex`` lines go to its stderr, which Ray points at its worker log
    (``worker-*-<pid>.err``); nothing said where that was. ``stderr_file`` is what a replica
    puts on the board; a stream that is no file (a pipe, a terminal) is no path."""
    code = "from loraplex.serve.logs import stderr_file; print(stderr_file())"
    log = tmp_path / "worker-abc-01000000-4242.err"
    with log.open("w") as err:
        done = subprocess.run(
            [sys.executable, "-c", code], stderr=err, stdout=subprocess.PIPE, text=True, check=True
        )
    assert done.stdout.strip() == str(log)
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert piped.stdout.strip() == "None"


def test_status_prints_where_each_replica_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gcs: int
) -> None:
    """``fleet status`` gave each replica's pid but not its log file: an operator had to know
    Ray's temp dir and match the pid in ``worker-*-<pid>.err`` by hand."""
    from loraplex.cli.fleet import LOG_UNKNOWN

    data = tmp_path / "data"
    _record(data, port=gcs, group=None)
    path = "/tmp/ray/session_latest/logs/worker-ab-01000000-4242.err"
    entries = [
        BoardEntry("live", {**_full_status("live", 4242), "log": path}, 0.1, 3.0),
        BoardEntry("older", _full_status("older", 4243), 0.2, 3.0),  # reports no log
        BoardEntry("odd", {**_full_status("odd", 4244), "log": 7}, 0.2, 3.0),
    ]
    monkeypatch.setattr(control, "board_entries", lambda record, data_dir, timeout_s: entries)
    result = _run("status", "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"log of live: {path}" in lines
    assert f"log of older: {LOG_UNKNOWN}" in lines and f"log of odd: {LOG_UNKNOWN}" in lines
    as_json = json.loads(_run("status", "--data-dir", str(data), "--json").output)
    assert [r["log"] for r in as_json["replicas"]] == [path, None, None]


def test_hints_name_the_loraplex_that_was_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    not_default_dir: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README runs ``.venv-fleet/bin/loraplex fleet up``; its hints said ``loraplex fleet
    status``, which a shell without that venv activated does not find."""
    script = tmp_path / "venv" / "bin" / "loraplex"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    script.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("PATH", str(elsewhere))  # no loraplex on PATH
    assert program(str(script)) == str(script)
    monkeypatch.setattr(sys, "argv", [str(script), "fleet", "up"])
    data = tmp_path / "data"
    assert control.fleet_command("down", data) == f"{script} fleet down --data-dir {data}"
    from loraplex.cli.fleet import _print_keys

    prepared = control.Prepared(tmp_path, "adm", False, {})  # a restart: no key issued
    _print_keys(prepared, ServeConfig(data_dir=data, admin_key="adm"))
    assert f"`{script} keys create TENANT --data-dir {data}`" in capsys.readouterr().out
    monkeypatch.setenv("PATH", str(script.parent))  # the same loraplex is on PATH: bare
    assert program(str(script)) == "loraplex"
    assert program("/usr/lib/python3/loraplex/__main__.py") == "loraplex"  # python -m
