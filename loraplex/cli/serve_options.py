"""The ``loraplex serve`` options that ``loraplex fleet up`` takes too, declared once (typed
``Annotated`` aliases, as ``cli/locations.py`` does for the registry location), with the defaults
in their help read from ``ServeConfig``: the two commands cannot diverge on a name, a type or a
stated default. Each option's name is the ServeConfig field it sets (``no_demo``: ``demo``)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer

from loraplex.serve.config import ServeConfig, SettingsRefused, flag_name
from loraplex.serve.logs import LOG_LEVELS

_DEFAULTS = {f.name: f.default for f in fields(ServeConfig)}


def _default(name: str) -> str:
    return str(_DEFAULTS[name])


Host = Annotated[
    str | None, typer.Option(help=f"HTTP listen address (default: {_default('host')}).")
]
Port = Annotated[int | None, typer.Option(help=f"HTTP listen port (default: {_default('port')}).")]
Model = Annotated[Path | None, typer.Option(help="Base model dir (default: the demo model).")]
SharedStateUrl = Annotated[
    str | None,
    typer.Option(
        envvar="LORAPLEX_SHARED_STATE_URL",
        help="Redis holding rate limits for all ingress processes (redis://).",
    ),
]
MaxLoras = Annotated[
    int | None,
    typer.Option(help=f"GPU adapter slots (of each replica) (default: {_default('max_loras')})."),
]
AdminKey = Annotated[
    str | None,
    typer.Option(envvar="LORAPLEX_ADMIN_KEY", help="Admin credential (default: generated, saved)."),
]
LogLevel = Annotated[
    str | None,
    typer.Option(
        help=f"Log level of loraplex's lines (stderr) and uvicorn's: {', '.join(LOG_LEVELS)} "
        f"(default: {_default('log_level')})."
    ),
]
NoDemo = Annotated[bool, typer.Option("--no-demo", help="Do not register demo adapters.")]

# fleet up's options that are serve's too, by parameter name (a test checks they are the same
# objects in both signatures); ``threads`` is not among them: per replica, its default differs.
SHARED = (
    "host",
    "port",
    "model",
    "shared_state_url",
    "max_loras",
    "admin_key",
    "no_demo",
    "log_level",
)


def bad_parameter(exc: ValueError | TypeError, config: Path | None) -> typer.BadParameter:
    """The usage error of a refused setting, naming what the user wrote: the flags the refusal
    is owed to (``Invalid value for '--max-loras': ...``), else the ``--config`` file (whose
    messages name its keys as written: ``threads``, not the field ``torch_threads``)."""
    if isinstance(exc, SettingsRefused) and exc.flags:
        return typer.BadParameter(str(exc), param_hint=[flag_name(f) for f in exc.flags])
    if isinstance(exc, SettingsRefused) and config is not None:
        return typer.BadParameter(f"config file {config}: {exc}")
    return typer.BadParameter(str(exc))
