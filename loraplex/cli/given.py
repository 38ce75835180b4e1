"""``given(ctx, name)``: whether an option was typed on the command line, not left at its default.

NOTE: typer carries its own click, so ``ctx.get_parameter_source`` answers with a
``ParameterSource`` member that is not ``click.core.ParameterSource``'s: compare by name.
"""

from __future__ import annotations

import typer


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter ``name`` (its Python name) came from the command line."""
    return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
