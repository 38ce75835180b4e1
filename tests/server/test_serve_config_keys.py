"""Config file keys are the flag names (``threads``, not the field ``torch_threads``), and a value
of the wrong TOML type is refused naming the key and the type expected (it used to fail later
with ``'<' not supported between instances of 'str' and 'int'``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.cli.serve import serve_settings
from loraplex.serve.config import merge, read_config_file


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(f'[serve]\ndata_dir = "state"\n{text}\n', encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('max_loras = "8"', "max_loras = '8' is invalid; expected an integer"),
        ("max_loras = true", "max_loras = True is invalid; expected an integer"),
        ("auto_warm = 1", "auto_warm = 1 is invalid; expected a boolean"),
        ('queue_deadline_s = "30"', "queue_deadline_s = '30' is invalid; expected a number"),
        ("host = 8", "host = 8 is invalid; expected a string"),
        ("threads = 1.5", "threads = 1.5 is invalid; expected an integer"),
        ("model = 3", "model = 3 is invalid; expected a string"),
    ],
)
def test_a_value_of_the_wrong_type_names_its_key_and_type(
    tmp_path: Path, line: str, expected: str
) -> None:
    with pytest.raises(ValueError, match=expected.replace(".", r"\.")):
        merge(read_config_file(_file(tmp_path, line)), {})


def test_whole_seconds_and_optional_values_are_accepted(tmp_path: Path) -> None:
    path = _file(tmp_path, "queue_deadline_s = 30\nmax_cpu_loras = 12\nadmin_port = 9001")
    config = merge(read_config_file(path), {})
    assert (config.queue_deadline_s, config.max_cpu_loras, config.admin_port) == (30, 12, 9001)


def test_serve_reports_a_wrongly_typed_key_without_a_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--config", str(_file(tmp_path, 'port = "80"'))])
    assert result.exit_code == 2, result.output
    assert "port = '80' is invalid; expected an integer" in result.output
    assert "Traceback" not in result.output and result.exception is not None


def test_the_threads_key_is_the_flag_name(tmp_path: Path) -> None:
    assert merge(read_config_file(_file(tmp_path, "threads = 3")), {}).torch_threads == 3
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    context = command.make_context("serve", ["--config", str(_file(tmp_path, "threads = 3"))])
    assert serve_settings(context.params, {}).torch_threads == 3
    with pytest.warns(FutureWarning, match="torch_threads is deprecated; use threads"):
        values = read_config_file(_file(tmp_path, "torch_threads = 2"))
    assert merge(values, {}).torch_threads == 2
    with pytest.raises(ValueError, match="torch_threads and threads are both set"):
        read_config_file(_file(tmp_path, "torch_threads = 2\nthreads = 2"))
