"""``fleet up``'s own settings (its flags and its ``[fleet]`` keys, not serve's) refused by name,
before any Ray start or key: ``--ready-timeout-s nan`` was taken (and failed the fleet as "not
ready" once it had started), ``--replicas -1`` said ``replicas -1 is invalid``, the field, not the
flag typed. Each flag and key is walked with an invalid value of its type, derived from the
command and from ``FLEET_KEYS``, not listed by hand, but those with none. A vLLM user's flags
get ``serve``'s hints (one table, ``serve/config/vllm.py``): each vLLM-only flag named with what
to use instead, and each flag vLLM shares with ``serve`` that ``fleet up`` has no flag for named
with its ``--config`` key; it was click's ``No such option: --enable-lora`` alone
(docs/benchmarks/vllmmigrate.md)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.cli.serve_options import SHARED
from loraplex.fleet import control
from loraplex.fleet.settings import FLEET_KEYS
from loraplex.serve.config import ServeConfig
from loraplex.serve.config.vllm import MODEL_ARGUMENT, VLLM_ONLY_FLAGS, VLLM_SHARED_FLAGS

# fleet up's options that set serve's settings (test_serve_refusals_name_the_input.py walks them)
SERVE_OPTIONS = {*SHARED, "threads", "data_dir", "database_url", "store", "s3_endpoint"}
# any value of these is taken: a file (its own errors name it), a cluster to join, any int seed
NO_INVALID_VALUE = frozenset({"config", "address", "seed"})
# a [fleet] key's invalid value, as TOML; ``seed`` takes any integer
BAD_KEY_VALUES = {
    "replicas": "-1",
    "policy": '"zz-unknown"',
    "report_period_s": "nan",
    "stale_after_s": "nan",
    "router": '"zz-unknown"',
    "topology": '"zz-unknown"',
    "engine_resource": '"zz-unknown"',
}


class Started(Exception):
    """Raised in place of starting anything: the settings were taken."""


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls that would issue keys, start a Ray head or connect to one, recorded instead."""
    calls: list[str] = []
    for name in ("prepare", "up", "start_local_cluster", "connect"):

        def started(*_: object, __name: str = name, **___: object) -> None:
            calls.append(__name)
            raise Started

        monkeypatch.setattr(control, name, started)
    return calls


def _own_options() -> list[tuple[str, str, str]]:
    """(name, flag, invalid value) of each of ``fleet up``'s own valued options."""
    group = typer.main.get_command(app).commands["fleet"]  # type: ignore[attr-defined]
    options = []
    for param in group.commands["up"].params:
        if param.name in SERVE_OPTIONS or param.is_flag:
            continue
        members = typing.get_args(param.type_descriptor.annotation) or (
            param.type_descriptor.annotation,
        )
        value = {int: "-1", float: "nan", str: "zz-unknown"}.get(members[0], "zz-unknown")
        options.append((param.name, param.opts[0], value))
    return options


@pytest.mark.parametrize(("name", "flag", "value"), _own_options())
def test_a_refused_own_flag_value_names_the_flag(
    nothing_starts: list[str], tmp_path: Path, name: str, flag: str, value: str
) -> None:
    if name in NO_INVALID_VALUE:
        pytest.skip(f"{flag} has no value refused when the settings are built")
    result = CliRunner().invoke(app, ["fleet", "up", flag, value, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, (flag, result.output, result.exception)
    assert f"Invalid value for '{flag}': " in result.output, result.output
    assert nothing_starts == []


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_ready_timeout_that_waits_for_nothing_or_forever_is_refused(
    nothing_starts: list[str], tmp_path: Path, value: str
) -> None:
    args = ["fleet", "up", "--ready-timeout-s", value, "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--ready-timeout-s': " in result.output, result.output
    assert nothing_starts == []


def test_every_fleet_key_is_walked() -> None:
    assert set(BAD_KEY_VALUES) | {"seed"} == set(FLEET_KEYS)


@pytest.mark.parametrize(("key", "value"), sorted(BAD_KEY_VALUES.items()))
def test_a_refused_fleet_key_names_the_file_and_the_key(
    nothing_starts: list[str], tmp_path: Path, key: str, value: str
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(f'[serve]\ndata_dir = "state"\n[fleet]\n{key} = {value}\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["fleet", "up", "--config", str(path)])
    assert result.exit_code == 2, (key, result.output, result.exception)
    output = " ".join(result.output.split())  # the usage box wraps long lines
    assert f"config file {path}: " in output and f"{key} " in output, result.output
    assert "Invalid value for '--" not in result.output  # no flag was given
    assert nothing_starts == []


def test_a_flag_over_a_file_value_is_named_not_the_file(
    nothing_starts: list[str], tmp_path: Path
) -> None:
    """The file's topology needs 2 replicas; ``--replicas 1`` is what is dropped to pass."""
    path = tmp_path / "fleet.toml"
    path.write_text('[serve]\ndata_dir = "state"\nmode = "auto"\n[fleet]\ntopology = {}\n')
    result = CliRunner().invoke(app, ["fleet", "up", "--config", str(path), "--replicas", "1"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--replicas': " in result.output, result.output
    assert nothing_starts == []


def _flags(*names: str) -> set[str]:
    command = typer.main.get_command(app)
    for name in names:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def _up(tmp_path: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["fleet", "up", *args, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_a_vllm_command_line_names_each_vllm_flag_and_what_to_use(
    tmp_path: Path, nothing_starts: list[str]
) -> None:
    said = _up(tmp_path, "/models/Llama-3-8B", "--enable-lora", "--lora-modules", "sql=/loras/sql")
    assert nothing_starts == []
    assert "vLLM's flags that loraplex fleet up does not take" in said, said
    assert "--enable-lora: loraplex always serves LoRA adapters" in said
    assert "--lora-modules: adapters are registered" in said
    assert "loraplex fleet up takes it as --model DIR" in said  # the positional MODEL


@pytest.mark.parametrize("flag", sorted(VLLM_ONLY_FLAGS))
def test_each_vllm_only_flag_is_refused_with_its_replacement(
    tmp_path: Path, nothing_starts: list[str], flag: str
) -> None:
    assert flag not in _flags("fleet", "up")  # the table never shadows one of fleet up's flags
    said = _up(tmp_path, f"{flag}=1")
    assert f"{flag}: {VLLM_ONLY_FLAGS[flag]}" in said, said
    assert nothing_starts == []


@pytest.mark.parametrize("flag", sorted(set(VLLM_SHARED_FLAGS) - _flags("fleet", "up")))
def test_a_shared_flag_fleet_up_lacks_is_named_with_its_config_key(
    tmp_path: Path, nothing_starts: list[str], flag: str
) -> None:
    key = flag.removeprefix("--").replace("-", "_")
    assert key in {f.name for f in ServeConfig.__dataclass_fields__.values()}
    said = _up(tmp_path, flag, "8")
    assert f"{flag}: loraplex fleet up takes it as {key} in the --config file's [serve]" in said
    assert "Possible options" not in said  # click's near names
    assert nothing_starts == []


def test_every_shared_flag_is_serves_and_the_hints_name_only_flags_both_take() -> None:
    """Each hint is true on both commands: a flag it names is one of both, or named as
    ``serve``'s (``serve's --dtype``), or inside a quoted command line (```loraplex fleet up
    --replicas N```)."""
    serve, fleet = _flags("serve"), _flags("fleet", "up")
    assert set(VLLM_SHARED_FLAGS) <= serve
    for text in [*VLLM_ONLY_FLAGS.values(), MODEL_ARGUMENT]:
        unquoted = re.sub(r"`[^`]*`", "", text)
        for match in re.finditer(r"(\S+ )?(--[a-z][a-z-]*)", unquoted):
            if match.group(1) != "serve's ":
                assert match.group(2) in serve and match.group(2) in fleet, (match.group(2), text)


def test_another_unknown_flag_keeps_clicks_error_alone(tmp_path: Path) -> None:
    said = _up(tmp_path, "--zz-unknown")
    assert "No such option: --zz-unknown" in said
    assert "vLLM" not in said
