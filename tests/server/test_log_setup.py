"""logs: loraplex's own log lines reach stderr through one handler on the ``loraplex`` tree (time,
level, logger name) at ``log_level``, set where a server starts, never at import; uvicorn takes
the same level. Before, they reached stderr only through Python's last-resort handler (no
level, no time, no name; INFO lines not at all)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.cli.serve import serve_settings
from loraplex.serve.config import ServeConfig
from loraplex.serve.logs import LOG_LEVELS, configure_logging

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

# "2026-12-06 20:31:02,117 INFO loraplex.engine.model_load: base model weights: ..."
_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO loraplex\.[\w.]+: .+$")


def test_importing_loraplex_configures_nothing() -> None:
    """A library user's logging is left alone: no handler, no level, propagation on."""
    code = (
        "import logging, loraplex.cli, loraplex.serve.config, loraplex.serve.logs\n"
        "lg = logging.getLogger('loraplex')\n"
        "print(lg.handlers, lg.level, lg.propagate)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[] 0 True"


def test_a_second_configuration_replaces_the_handler(capsys: pytest.CaptureFixture[str]) -> None:
    """(tests/conftest.py puts the logger back after each test.)"""
    configure_logging("info")
    configure_logging("warning")
    logger = logging.getLogger("loraplex")
    assert len(logger.handlers) == 1 and logger.level == logging.WARNING
    assert not logger.propagate  # a root handler would print each line twice
    logging.getLogger("loraplex.residency.x").info("not shown")
    logging.getLogger("loraplex.residency.x").warning("shown once")
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 2)[2] for line in err] == ["WARNING loraplex.residency.x: shown once"]


def test_the_flag_and_the_key_set_log_level(tmp_path: Path) -> None:
    params = {name: None for name in ("config", "data_dir", "log_level")} | {
        "no_demo": False,
        "threads": None,
    }
    assert serve_settings(params, {}).log_level == "info"  # the default
    flagged = serve_settings({**params, "log_level": "debug"}, {})
    assert flagged.log_level == "debug"
    config = tmp_path / "serve.toml"
    config.write_text('[serve]\nlog_level = "warning"\n')
    assert serve_settings({**params, "config": config}, {}).log_level == "warning"
    both = serve_settings({**params, "config": config, "log_level": "error"}, {})
    assert both.log_level == "error"  # the flag over the file


@pytest.mark.parametrize("bad", ["loud", "INFO", "trace", "", 10])
def test_a_bad_level_is_refused_naming_the_key_and_the_levels(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="log_level") as caught:
        ServeConfig(data_dir=tmp_path, log_level=bad)  # type: ignore[arg-type]
    assert all(level in str(caught.value) for level in LOG_LEVELS)


@pytest.mark.parametrize("command", [["serve"], ["fleet", "up"]])
def test_the_cli_refuses_a_bad_level_before_starting(tmp_path: Path, command: list[str]) -> None:
    args = [*command, "--data-dir", str(tmp_path), "--log-level", "loud"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "log_level 'loud' is invalid" in result.output
    assert not any(tmp_path.iterdir())  # nothing started, no key issued


def test_a_real_start_writes_formatted_info_lines(tmp_path: Path, demo_assets: DemoAssets) -> None:
    """``loraplex serve`` on the small model: the engine process (forked after the handler was
    set) logs the base weights' bytes at INFO, once, formatted."""
    command = [sys.executable, "-m", "loraplex", "serve", "--data-dir", str(tmp_path / "data"),
               "--model", str(demo_assets.base_model_dir), "--no-demo", "--port", "0",
               "--threads", "1", "--log-level", "info"]  # fmt: skip
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert server.stdout is not None
            assert "loraplex serving on" in server.stdout.readline(), err_path.read_text()
            deadline = time.monotonic() + 240.0  # a loaded 2-core machine
            while "base model weights" not in err_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            server.terminate()
            server.wait(60)
    lines = [line for line in err_path.read_text().splitlines() if "base model weights" in line]
    assert len(lines) == 1, err_path.read_text()  # shown, and not twice
    assert _LINE.match(lines[0]), lines[0]
