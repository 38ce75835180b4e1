"""Every help text of the command line reaches ``--help`` whole: typer renders them as rich
markup, where ``[default: no cap]`` or ``[fleet]`` is a style tag and vanished from the page
(``--data-dir`` read "Data directory" without its default)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main
from rich.markup import render

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


def test_no_help_text_loses_brackets_to_markup() -> None:
    texts = list(_texts(typer.main.get_command(cli.app), "loraplex"))
    assert len(texts) > 500  # every command and option was walked
    lost = [(where, text) for where, text in texts if render(text).plain != _unescaped(text)]
    assert lost == []


def _unescaped(text: str) -> str:
    return text.replace("\\[", "[")


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
