"""Every help text and flag name of the command line reaches ``--help`` whole, at 80 columns and
piped: typer's rich layout read ``[default: no cap]`` or ``[fleet]`` as a style tag (gone from
the page) and cut long flag names in its table (``--max-concurrent-loa…``); the help is
click's plain layout now, which prints each text as written."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

import loraplex.cli as cli


def _texts(command: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every command's and option's help under ``command`` (typer's own command classes,
    which are not click's)."""
    if command.help:
        yield path, command.help
    for param in command.params:
        help_text = getattr(param, "help", None)
        if help_text:
            yield f"{path} {param.name}", help_text
    for name, sub in getattr(command, "commands", {}).items():
        yield from _texts(sub, f"{path} {name}")


def test_no_help_text_carries_markup() -> None:
    """No markup reaches a plain page: a rich escape (``\\[fleet]``) would print as written."""
    texts = list(_texts(typer.main.get_command(cli.app), "loraplex"))
    assert len(texts) > 500  # every command and option was walked
    assert [(where, text) for where, text in texts if "\\[" in text or "[/" in text] == []


def _commands(command: Any, words: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield words, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*words, name])


def test_every_flag_and_help_text_prints_whole_at_80_columns() -> None:
    """`serve --help` in an 80-column terminal, or piped, cut 16 flag names
    (`--max-concurrent-loa…`, `--max-unauthenticate…`) and long help words
    (`$XDG_DATA_HOME/lorap…`) in typer's rich table."""
    runner = CliRunner()
    pages = list(_commands(typer.main.get_command(cli.app), []))
    assert len(pages) > 50
    for words, command in pages:
        page = runner.invoke(cli.app, [*words, "--help"], env={"COLUMNS": "80"}).output
        assert "…" not in page, words
        flat = "".join(page.split())  # NOTE: click wraps a long help word (a default) anywhere
        for param in command.params:
            for flag in (*param.opts, *param.secondary_opts):
                if flag.startswith("--"):
                    assert re.search(re.escape(flag) + r"(?![a-z0-9-])", page), (words, flag)
            if getattr(param, "help", None):
                assert "".join(param.help.split()) in flat, (words, param.name)


def _summaries(command: Any, path: str) -> Iterator[tuple[str, str]]:
    """What each group's listing shows of each of its commands (typer's rich listing: the
    ``short_help``, else the help's first paragraph, line breaks kept)."""
    for name, sub in getattr(command, "commands", {}).items():
        yield f"{path} {name}", sub.short_help or (sub.help or "").split("\n\n")[0]
        yield from _summaries(sub, f"{path} {name}")


def test_every_listed_summary_is_one_line() -> None:
    """`loraplex --help` broke `backup`'s summary after "the demo", mid-sentence (13 commands'
    docstrings open with a paragraph of two lines)."""
    summaries = list(_summaries(typer.main.get_command(cli.app), "loraplex"))
    assert len(summaries) > 50
    assert [where for where, text in summaries if "\n" in text.strip()] == []
