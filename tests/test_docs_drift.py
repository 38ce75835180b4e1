"""docs/operations.md stays true to the code: every ``loraplex serve`` setting and flag is in it,
it names no setting that does not exist, its plain defaults are the code's, and each environment
variable it lists is read by the commands it says read it (and every variable a command reads is
listed for that command)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from loraplex.cli import app
from loraplex.serve.config import file_keys

DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
# The commands "every registry command" stands for: everything under these groups.
REGISTRY_GROUPS = ("adapters", "tenants", "keys", "release")
# Commands in those groups that open no registry (the table says "except" them).
NO_REGISTRY = {"adapters sign"}  # signs a local folder with model-signing
_TICKED = re.compile(r"`([^`]+)`")


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(space-separated name, click command) of every leaf command under ``command``."""
    if isinstance(command, typer.core.TyperGroup):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


COMMANDS = dict(_commands(typer.main.get_command(app)))


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _table_rows(section: str) -> list[list[str]]:
    """The cells of every table row of ``section`` but the header and separator rows."""
    lines = [line.strip() for line in section.splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    return [r for r in rows if len(r) > 1 and not set(r[0]) <= {"-"} and r[0] != "variable"]


def _serve_table() -> list[list[str]]:
    section = _section("`loraplex serve`")
    return [r for r in _table_rows(section.split("### ")[0]) if r[0].startswith("`")]


def _reads(command: str, variable: str) -> bool:
    """Whether ``command`` reads ``variable``: an option's envvar, or its module's code."""
    click_command = COMMANDS[command]
    if any(getattr(p, "envvar", None) == variable for p in click_command.params):
        return True
    module = importlib.import_module(click_command.callback.__module__)
    return f'"{variable}"' in Path(str(module.__file__)).read_text(encoding="utf-8")


def _documented_readers() -> dict[str, set[str]]:
    """Variable -> the commands the *State and environment* table says read it."""
    readers: dict[str, set[str]] = {}
    for row in _table_rows(_section("State and environment")):
        variable, read_by = _TICKED.match(row[0]), row[1]
        assert variable is not None, row
        named = {c for c in _TICKED.findall(read_by) if c in COMMANDS}
        if "every registry command" in read_by:
            named |= {c for c in COMMANDS if c.split()[0] in REGISTRY_GROUPS} - NO_REGISTRY
        readers[variable.group(1)] = named
    return readers


def test_every_serve_setting_is_documented() -> None:
    keys = {key for row in _serve_table() for key in _TICKED.findall(row[0])}
    # `--flag`, `key` or `key = value`; the upper-case names are environment variables
    toml_keys = {key.split(" ")[0] for key in keys if key[0].islower()}
    missing = file_keys() - toml_keys
    assert not missing, f"config file keys missing from operations.md: {sorted(missing)}"
    stale = toml_keys - file_keys()
    assert not stale, f"operations.md documents TOML keys the config file lacks: {sorted(stale)}"


def test_every_serve_flag_is_documented() -> None:
    first_column = " ".join(row[0] for row in _serve_table())
    documented = set(re.findall(r"--[a-z0-9-]+", first_column))
    flags = {opt for p in COMMANDS["serve"].params for opt in (*p.opts, *p.secondary_opts)}
    assert flags - documented == set(), "serve flags missing from operations.md"
    assert documented - flags == set(), "operations.md documents serve flags that do not exist"


def test_every_listed_variable_is_read_by_its_commands() -> None:
    readers = _documented_readers()
    whole_doc = DOC.read_text(encoding="utf-8")
    unlisted = set(re.findall(r"LORAPLEX_[A-Z0-9_]+", whole_doc)) - set(readers)
    assert not unlisted, f"variables used in operations.md but not in its table: {unlisted}"
    for variable, commands in readers.items():
        if variable.startswith("LORAPLEX_"):
            assert commands, f"{variable}: the table names no command that reads it"
        for command in commands:
            assert _reads(command, variable), f"`{command}` does not read {variable}"


def test_every_variable_a_command_reads_is_listed_for_it() -> None:
    readers = _documented_readers()
    for name, command in COMMANDS.items():
        for param in command.params:
            variable = getattr(param, "envvar", None)
            if variable is not None:
                assert name in readers.get(variable, set()), f"{variable} of `{name}` unlisted"


# --- fleets and Kubernetes: every flag and key a fleet or a render reads is documented, and no
# documented one is unread (operations.md's fleet table, fleet.md's, kubernetes.md's flags) ----

DOCS = DOC.parent


def _first_column_table(path: Path, header: str) -> str:
    """The first cells of the table whose header row starts with ``header``, joined."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header}"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line.strip("|").split(" | ")[0])
    return " ".join(rows)


def _flags(command: str) -> set[str]:
    params = COMMANDS[command].params
    return {opt for p in params for opt in (*p.opts, *p.secondary_opts)} - {"--help"}


@pytest.mark.parametrize("doc", ["operations.md", "fleet.md"])
def test_every_fleet_flag_and_key_is_documented(doc: str) -> None:
    from loraplex.fleet.settings import FLEET_KEYS

    column = _first_column_table(DOCS / doc, "`fleet up` flag / `[fleet]` key")
    documented_flags = set(re.findall(r"--[a-z0-9-]+", column))
    assert _flags("fleet up") - documented_flags == set(), f"fleet up flags missing from {doc}"
    assert documented_flags - _flags("fleet up") == set(), f"{doc} documents unknown flags"
    keys = {k.split(" ")[0] for k in _TICKED.findall(column) if not k.startswith(("-", "["))}
    assert set(FLEET_KEYS) - keys == set(), f"[fleet] keys missing from {doc}"
    assert keys - set(FLEET_KEYS) == set(), f"{doc} documents [fleet] keys that do not exist"


def test_every_k8s_render_flag_is_documented() -> None:
    column = _first_column_table(DOCS / "kubernetes.md", "flag |")
    documented = set(re.findall(r"--[a-z0-9-]+", column))
    assert _flags("k8s render") - documented == set(), "k8s render flags missing"
    assert documented - _flags("k8s render") == set(), "kubernetes.md documents unknown flags"


def _size(text: str) -> float | None:
    """``16 KiB``, ``1 GiB`` in bytes; None for anything else."""
    match = re.fullmatch(r"(\d+) (KiB|MiB|GiB)", text)
    if match is None:
        return None
    return int(match.group(1)) * 1024 ** (["KiB", "MiB", "GiB"].index(match.group(2)) + 1)


def test_serve_table_defaults_are_serve_config_defaults() -> None:
    """Each row of one key whose default cell is a plain number, word or size (`` `30` ``,
    ``16 KiB``, `` `cost_aware` ``) states ``ServeConfig``'s default (a key whose default is
    worked out at start is skipped)."""
    from loraplex.serve.config import ServeConfig
    from loraplex.serve.config.keys import FILE_KEYS

    defaults = {f.name: f.default for f in dataclasses.fields(ServeConfig)}
    checked, wrong = 0, []
    for row in _serve_table():
        keys = [k.split(" ")[0] for k in _TICKED.findall(row[0]) if k[0].islower()]
        literal = re.fullmatch(r"`([\w.]+)`|(\d+ [KMG]iB)|(\d+)", row[-1])
        if len(keys) != 1 or literal is None:
            continue
        default = defaults[FILE_KEYS.get(keys[0], keys[0])]
        if default is None:
            continue  # worked out at start (`host`, 1 GiB): the cell says from what
        text = next(g for g in literal.groups() if g is not None)
        number = _size(text) or (float(text) if re.fullmatch(r"\d+(\.\d+)?", text) else None)
        if isinstance(default, bool):
            same = str(default).lower() == text  # TOML's spelling
        elif number is not None and isinstance(default, int | float):
            same = float(default) == number
        else:
            same = str(default) == text
        checked += 1
        if not same:
            wrong.append(f"{keys[0]}: documented {text}, code {default!r}")
    assert checked > 30, "the table's defaults were not read"
    assert wrong == [], wrong
