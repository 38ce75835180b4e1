"""Every ``loraplex`` command line in the code blocks of README.md and docs/ parses with the CLI
it documents: the command exists, each flag is one of its options, no argument is missing or
extra. Values are not judged (``--max-gpu-bytes B`` is a placeholder), only the command's shape,
so a flag renamed or removed without its docs fails here. Parsing runs no command."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer._click import core as click_core  # typer 0.29 vendors click; its parse errors
from typer._click import exceptions as click_errors

from loraplex.cli import app

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)
# ``loraplex`` as a program (``.venv/bin/loraplex``, ``loraplex``), not ``python -m loraplex``
_CALL = re.compile(r"(?:^|\s|/)loraplex ((?!-m\b)[a-z].*)$")
CLI = typer.main.get_command(app)


def doc_commands() -> Iterator[tuple[str, str]]:
    """(file:block line, the words after ``loraplex``) of every command line in a code block;
    continuation lines are joined and ``&&``, ``;`` and a pipe `` | `` end a command."""
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for block in _BLOCK.finditer(text):
            line_no = text.count("\n", 0, block.start()) + 2
            joined = re.sub(r"\\\n\s*", " ", block.group(1))
            for offset, line in enumerate(joined.splitlines()):
                for part in re.split(r"&&|;|\s\|\s", line):
                    found = _CALL.search(part.strip())
                    if found and not part.strip().startswith(("#", "from ", "import ")):
                        where = f"{path.relative_to(ROOT)}:{line_no + offset}"
                        yield where, found.group(1)


def _words(text: str) -> list[str]:
    """Shell words, optional ``[...]`` parts kept as given, the first of ``a|b`` alternatives;
    a line quoted for another program (``bash -c '... loraplex X'``) loses its closing quote."""
    text = text.replace("[", " ").replace("]", " ")
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # the closing quote of an outer program's argument
        words = shlex.split(text.rstrip().rstrip("'\""), comments=True)
    return [w.split("|")[0] if re.fullmatch(r"[a-z-]+(\|[a-z-]+)+", w) else w for w in words]


def shape_error(words: list[str]) -> str | None:
    """Why ``loraplex WORDS`` does not parse (a missing command, an unknown flag, a missing or
    extra argument); None when it does. A value its type refuses is not an error here, nor a
    missing argument in a synopsis that elides them (``...``)."""
    elided = "..." in words
    command: click_core.Command = CLI
    names: list[str] = []
    while isinstance(command, typer.core.TyperGroup) and words and not words[0].startswith("-"):
        sub = command.commands.get(words[0])
        if sub is None:
            return f"no command {' '.join([*names, words[0]])!r}"
        names.append(words.pop(0))
        command = sub
    if isinstance(command, typer.core.TyperGroup):
        return None if words[:1] == ["--help"] else f"{' '.join(names)!r} needs a command"
    try:
        command.make_context("loraplex " + " ".join(names), words)
    except typer.Exit:  # --help
        return None
    except click_errors.MissingParameter as exc:
        return None if elided else exc.format_message()
    except click_errors.BadParameter as exc:
        return None if type(exc) is click_errors.BadParameter else exc.format_message()
    except click_errors.UsageError as exc:
        return exc.format_message()
    return None


COMMANDS = list(doc_commands())


def test_the_docs_hold_command_lines() -> None:
    assert len(COMMANDS) > 100  # the extraction found them (182 when written)


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_documented_command_line_parses(where: str, line: str) -> None:
    assert shape_error(_words(line)) is None, f"{where}: loraplex {line}"


@pytest.mark.parametrize(
    "line",
    [
        "release start acme/support r2 --ladder 10%,50% --dwelll 30s",  # unknown flag
        "adapters registerr DIR --tenant T",  # unknown command
        "adapters register --tenant T --name N --revision R",  # missing argument
        "keys create acme globex",  # extra argument
        "tenants trust",  # a group without its command
    ],
)
def test_a_wrong_line_is_caught(line: str) -> None:
    assert shape_error(_words(line)) is not None
