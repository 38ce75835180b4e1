"""A 401 with the admin key read from ``<data dir>/admin-key`` names that file: a ``serve``
started with ``--admin-key`` (or ``LORAPLEX_ADMIN_KEY``) leaves the file as it was, so it may hold
an older key. NOTE: the refusal only asked "is the admin key right?"."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from local_http import local_server
from typer.testing import CliRunner

from loraplex.cli import app


class _Refusing(BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        body = b'{"error": {"message": "invalid admin key"}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _refuse

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_url() -> Iterator[str]:
    with local_server(_Refusing) as url:
        yield url


def _preflight(url: str, data_dir: Path, *extra: str) -> str:
    argv = ["preflight", "--url", url, "--data-dir", str(data_dir), "--timeout-s", "5", *extra]
    result = CliRunner().invoke(app, argv, env={"LORAPLEX_ADMIN_KEY": ""})
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


def test_a_401_with_the_key_file_names_the_file_and_admin_key(
    refusing_url: str, tmp_path: Path
) -> None:
    (tmp_path / "admin-key").write_text("lpxadmin_" + "o" * 40 + "\n", encoding="utf-8")
    out = _preflight(refusing_url, tmp_path)
    assert "-> 401" in out
    assert f"the admin key was read from {tmp_path / 'admin-key'}" in out
    assert "serve started with --admin-key (or LORAPLEX_ADMIN_KEY)" in out


def test_a_401_with_a_given_key_does_not_blame_the_file(refusing_url: str, tmp_path: Path) -> None:
    out = _preflight(refusing_url, tmp_path, "--admin-key", "lpxadmin_" + "g" * 40)
    assert "-> 401" in out and "read from" not in out


def test_no_key_and_no_key_file_names_the_data_dir_flag(tmp_path: Path) -> None:
    # a new operator who started `serve --data-dir D` was told only to pass the admin key
    argv = ["preflight", "--url", "http://127.0.0.1:9", "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(app, argv, env={"LORAPLEX_ADMIN_KEY": ""})
    assert result.exit_code == 2, result.output
    out = "".join(result.output.replace("│", "").split())
    assert "passthedeployment'sadminkey,orthe--data-dir(LORAPLEX_DATA_DIR)" in out
