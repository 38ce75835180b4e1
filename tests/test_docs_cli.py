"""Every command's flags are documented where the operations guide documents that command, each
flag a table there names exists, and a table's plain default is the code's (a flag added,
renamed or re-defaulted without its doc fails here).

Where a command is documented: its own ``## `loraplex NAME` `` section of docs/operations.md, else
the paragraph that opens with `` `loraplex NAME` `` there (up to the next command's paragraph or
section); the registry commands under *Registry commands*; ``release`` and ``adapters alias`` in
docs/releases.md, ``k8s render`` in docs/kubernetes.md, as operations.md says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from test_docs_drift import COMMANDS

DOCS = Path(__file__).resolve().parents[1] / "docs"
OPS = (DOCS / "operations.md").read_text(encoding="utf-8")


def _section(text: str, title: str) -> str | None:
    start = text.find(f"\n## {title}\n")
    if start < 0:
        return None
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _opening(line: str) -> str | None:
    """The command a paragraph opening with `` `loraplex NAME ...` `` documents, the longest."""
    named = [n for n in COMMANDS if re.match(rf"`loraplex {re.escape(n)}[` \[]", line)]
    return max(named, key=len) if named else None


def _paragraphs(name: str) -> str:
    """The lines from each paragraph that opens with ``name`` to the next command's opening."""
    lines, on, previous = [], False, ""
    for line in OPS.splitlines():
        opened = _opening(line) if previous == "" else None
        if opened is not None:
            on = opened == name
        elif line.startswith("## "):
            on = False
        if on:
            lines.append(line)
        previous = line.strip()
    return "\n".join(lines)


def _scope(name: str) -> str:
    top = name.split(maxsplit=1)[0]
    if top == "release" or name.startswith("adapters alias"):
        return (DOCS / "releases.md").read_text(encoding="utf-8")
    if name == "k8s render":
        return (DOCS / "kubernetes.md").read_text(encoding="utf-8")
    if top in ("adapters", "tenants", "keys"):
        return _section(OPS, "Registry commands") or ""
    own = _section(OPS, f"`loraplex {name}`") or _paragraphs(name)
    return own or _section(OPS, f"`loraplex {top}`") or ""


def _flags(command: click.Command) -> set[str]:
    names = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    return {n for n in names if n.startswith("--")} - {"--help"}


def _named(flag: str, text: str) -> bool:
    return re.search(re.escape(flag) + r"(?![a-z0-9-])", text) is not None


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_is_documented_with_its_command(name: str) -> None:
    scope = _scope(name)
    assert scope, f"`loraplex {name}` is documented nowhere in operations.md"
    missing = sorted(f for f in _flags(COMMANDS[name]) if not _named(f, scope))
    assert missing == [], f"`loraplex {name}` flags missing from its docs: {missing}"


def _own_rows(name: str) -> list[list[str]]:
    """The table rows of the text documenting ``name`` alone (its section or paragraphs)."""
    own = _section(OPS, f"`loraplex {name}`") or _paragraphs(name)
    rows = [line.strip("|").split(" | ") for line in own.splitlines() if line.startswith("|")]
    return [[c.strip() for c in r] for r in rows if r[0].lstrip().startswith("`--")]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_documented_flag_exists(name: str) -> None:
    flags = _flags(COMMANDS[name])
    documented = {f for row in _own_rows(name) for f in re.findall(r"--[a-z0-9-]+", row[0])}
    assert documented - flags == set(), f"docs name `loraplex {name}` flags it lacks"


# The pages that document a command elsewhere, whose flag tables name their default column.
ELSEWHERE = {"release start": "releases.md", "k8s render": "kubernetes.md"}


def _default_rows(name: str) -> Iterator[tuple[str, str]]:
    """(first cell, default cell) of each flag row of the tables documenting ``name``."""
    if name not in ELSEWHERE:
        yield from ((row[0], row[-1]) for row in _own_rows(name) if len(row) == 3)
        return
    column = None
    for line in (DOCS / ELSEWHERE[name]).read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("|"):
            column = None
        elif "default" in cells and cells[0].split(" ")[0] in ("flag", "option", "threshold"):
            column = cells.index("default")
        elif column is not None and cells[0].startswith("`--") and len(cells) > column:
            yield cells[0], cells[column]


def _plain_defaults(name: str) -> Iterator[tuple[str, str]]:
    """(flag, documented default) of each row naming one flag (or its ``--x/--no-x`` pair) whose
    default cell is one plain literal: `` `3` ``, ``0.5``, `` `small` ``."""
    for first, default in _default_rows(name):
        flags = re.findall(r"`(--[a-z0-9-]+)(?:/--[a-z0-9-]+)?(?: [^`]*)?`", first)
        literal = re.fullmatch(r"`([\w.,-]+)`|(\d+(?:\.\d+)?)", default)
        if len(flags) == 1 and literal is not None:
            yield flags[0], next(g for g in literal.groups() if g is not None)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_documented_defaults_are_the_code_defaults(name: str) -> None:
    params = {opt: p for p in COMMANDS[name].params for opt in p.opts}
    wrong = []
    for flag, documented in _plain_defaults(name):
        default = params[flag].default
        if isinstance(default, bool) or default in (None, ""):
            continue  # on/off and "none" are words in the docs; "" a default worked out later
        if isinstance(default, int | float):
            same = re.fullmatch(r"-?[\d.]+", documented) and float(documented) == default
        else:
            same = documented == str(getattr(default, "value", default))
        if not same:
            wrong.append(f"{flag}: documented {documented}, code {default!r}")
    assert wrong == [], f"`loraplex {name}`: {wrong}"
