"""``loraplex serve --help`` states the defaults ``ServeConfig`` has: each option whose help ends
with a plain default (``(default: 32)``, ``(30)``, ``(256 KiB)``, ``(default: cpu)``) names the
code's. The options' own defaults are None (a flag not given leaves the file's value), so the
help text is the one place a user reads them, and nothing else compared them."""

from __future__ import annotations

import re
from dataclasses import fields

import typer.main

from loraplex.cli import app
from loraplex.serve.config import ServeConfig
from loraplex.serve.config.keys import FILE_KEYS

_STATED = re.compile(r"\((?:default: )?([\w.]+|\d+ [KMG]iB)\)\.?$")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _value(text: str) -> float | str:
    number, _, unit = text.partition(" ")
    if unit in _UNITS:
        return int(number) * _UNITS[unit]
    try:
        return float(text)
    except ValueError:
        return text


def test_serve_help_states_the_config_defaults() -> None:
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    defaults = {f.name: f.default for f in fields(ServeConfig)}
    checked, wrong = 0, []
    for param in command.params:
        stated = _STATED.search(getattr(param, "help", None) or "")
        field = FILE_KEYS.get(str(param.name), str(param.name))
        if stated is None or stated.group(1) == "default" or defaults.get(field) is None:
            continue  # no plain default stated, or one worked out at start (threads, bytes)
        default = defaults[field]
        text = stated.group(1)
        value = _value(text)
        if isinstance(default, bool):
            same = text == ("on" if default else "off")
        elif isinstance(value, str):
            same = str(default) == text
        else:
            same = float(default) == value
        checked += 1
        if not same:
            wrong.append(f"--{field.replace('_', '-')}: help says {text}, code {default!r}")
    assert checked >= 25, "the help texts' defaults were not read"
    assert wrong == []
