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
