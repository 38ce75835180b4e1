"""A refused ``loraplex serve`` setting names what the user wrote: the flag (``--max-loras -1``
said ``Invalid value: max_loras -1 ...``, the field), or the config file and its key. Every flag
and every file key is walked with a value of its type that is invalid (derived from the command
and from ``ServeConfig``, not listed by hand), but those that have none at configuration time."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.cli.serve_options import SHARED
from loraplex.serve.config import ServeConfig, file_keys
from loraplex.serve.config.keys import FILE_KEYS

# Flags (and keys) any value of which is taken when the configuration is built: a string the
# server opens or sends later (an unreachable host, a registry URL, a model directory, a key, a
# request log path: "zz-unknown" is a file it may create); a boolean has no invalid value.
# ``--config``'s own errors name the file it names.
NO_INVALID_VALUE = frozenset(
    {"config", "host", "model", "data_dir", "database_url", "store", "s3_endpoint", "admin_key"}
)
NO_INVALID_KEY = NO_INVALID_VALUE | {"request_log_path"}


class Started(Exception):
    """Raised in place of starting the server: the settings were taken."""


def _bad_value(kind: object) -> str | None:
    """A value of ``kind`` (a field's type) that no setting of it takes; None for booleans."""
    members = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    kinds = [m for m in members if m is not type(None)]
    return {int: "-1", float: "nan", str: "zz-unknown", Path: "zz-unknown"}.get(kinds[0])


def _serve_options() -> list[tuple[str, str]]:
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    options = []
    for param in command.params:
        kind = param.type_descriptor.annotation
        if param.param_type_name == "option" and not param.is_flag and kind is not bool:
            options.append((param.name, param.opts[0]))
    return options


def _run_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(_: object) -> None:
        raise Started

    monkeypatch.setattr("loraplex.cli.serve._run", started)


@pytest.mark.parametrize(("name", "flag"), _serve_options())
def test_a_refused_flag_value_names_the_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, flag: str
) -> None:
    if name in NO_INVALID_VALUE:
        pytest.skip(f"{flag} has no value refused when the settings are built")
    kind = typing.get_type_hints(ServeConfig).get(FILE_KEYS.get(name, name))
    value = _bad_value(kind) or "zz-unknown"
    _run_instead(monkeypatch)
    result = CliRunner().invoke(app, ["serve", flag, value, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, (flag, result.output, result.exception)
    assert f"Invalid value for '{flag}': " in result.output, result.output


def _file_fields() -> list[str]:
    return sorted(FILE_KEYS.get(key, key) for key in file_keys())


@pytest.mark.parametrize("name", _file_fields())
def test_a_refused_file_value_names_the_file_and_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    key = next((k for k, field in FILE_KEYS.items() if field == name), name)
    value = _bad_value(typing.get_type_hints(ServeConfig)[name])
    if value is None:
        pytest.skip(f"{key} is a boolean")
    if name in NO_INVALID_KEY:
        pytest.skip(f"{key} has no value refused when the settings are built")
    text = value if value in ("-1", "nan") else f'"{value}"'
    path = tmp_path / "serve.toml"
    path.write_text(f'[serve]\ndata_dir = "state"\n{key} = {text}\n', encoding="utf-8")
    _run_instead(monkeypatch)
    result = CliRunner().invoke(app, ["serve", "--config", str(path)])
    assert result.exit_code == 2, (key, result.output, result.exception)
    assert f"config file {path}: " in result.output and f"{key} " in result.output, result.output
    assert "Invalid value for '--" not in result.output  # no flag was given


def test_a_pair_refused_together_names_both_flags(tmp_path: Path) -> None:
    args = ["serve", "--port", "9000", "--admin-port", "9000", "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--max-loras", "4"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port' / '--admin-port': " in result.output


def test_a_flag_refused_with_a_file_value_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text('[serve]\ndata_dir = "state"\nmax_num_seqs = 64\n', encoding="utf-8")
    args = ["serve", "--config", str(path), "--max-num-batched-tokens", "32"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--max-num-batched-tokens': " in result.output


def _fleet_serve_options() -> list[str]:
    """``fleet up``'s options that set ServeConfig fields (``SHARED`` and --threads; its own
    --replicas, --policy (the router's), ... do not), less those with no invalid value."""
    group = typer.main.get_command(app).commands["fleet"]  # type: ignore[attr-defined]
    serve_names = {*SHARED, "threads"} - NO_INVALID_VALUE - {"no_demo"}
    return [p.opts[0] for p in group.commands["up"].params if p.name in serve_names]


@pytest.mark.parametrize("flag", _fleet_serve_options())
def test_a_refused_fleet_up_flag_value_names_the_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: str
) -> None:
    from loraplex.fleet import control

    def started(*_: object, **__: object) -> None:
        raise Started

    monkeypatch.setattr(control, "prepare", started)
    monkeypatch.setattr(control, "up", started)
    key = flag[2:].replace("-", "_")
    kind = typing.get_type_hints(ServeConfig)[FILE_KEYS.get(key, key)]
    args = ["fleet", "up", flag, _bad_value(kind) or "zz-unknown", "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (flag, result.output, result.exception)
    assert f"Invalid value for '{flag}': " in result.output, result.output
