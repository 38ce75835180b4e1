"""``choice_of(Kind)``: the ``parser`` of a typer option or argument typed by an Enum.

NOTE: typer converts an Enum-typed value through pydantic, whose refusal reached the operator as
``Invalid value for '--state': Value error, 'zz' is not one of 'canary', 'stable', ...``; this
parser refuses with typer's own usage error (exit 2), which names the option and the values:
``Invalid value for '--state': 'zz' is not one of canary, stable, deprecated``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TypeVar

import typer

E = TypeVar("E", bound=Enum)


def choice_of(kind: type[E]) -> Callable[[str | E], E]:
    """A parser taking a member of ``kind`` or its value, and refusing anything else."""

    def parse(value: str | E) -> E:
        if isinstance(value, kind):
            return value  # the declared default
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(str(member.value) for member in kind)
            raise typer.BadParameter(f"{value!r} is not one of {allowed}") from None

    return parse
