"""The ``loraplex`` command. Environment variables and argv are read here (and in the modules of
this package) only; every other module receives plain, typed arguments.

Each module in ``_COMMAND_MODULES`` defines ``register(app)``, adding its commands or groups.
Heavy imports (torch, transformers) happen inside command bodies so ``--help`` stays fast.
``app`` (every command) is built on first use; ``main`` builds only the modules of a command
``_OWN_MODULES`` names (``loraplex serve`` imports its own module, not the 18 others, before it
starts its engine process: that import is on the start's critical path).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys

import typer

_COMMAND_MODULES: tuple[str, ...] = (
    "demo",
    "assets",
    "generate",
    "registry",
    "tenants",
    "keys",
    "backup",
    "release",
    "bench",
    "signing",  # after "bench": it adds `bench signing` to that group
    "serve",
    "k8s",
    "fleet",
    "preflight",
    "sim",
    "plan",
    "bench_sim",  # after "bench": it adds `bench sim` to that group
    "bench_plan_check",  # after "bench": it adds `bench plan-check` to that group
    "qualify",
    "baselines",  # after "bench": it adds `bench baselines` to that group
)

# Top-level commands that one module registers entirely, and that module (tests/test_cli_lazy.py
# checks each against the full app): ``main`` imports only it for such a command.
_OWN_MODULES: dict[str, tuple[str, ...]] = {"serve": ("serve",)}


def build_app(modules: tuple[str, ...] = _COMMAND_MODULES) -> typer.Typer:
    """The command line with the commands of ``modules`` (each ``loraplex.cli.<name>``)."""
    built = typer.Typer(
        name="loraplex",
        help="Serve one base LLM with thousands of LoRA adapters for many tenants.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        # NOTE: click's plain layout, not typer's rich table: at 80 columns, or piped, the table
        # cut 16 of serve's flag names (`--max-concurrent-loa…`) and long words of the help
        rich_markup_mode=None,
    )
    built.callback()(_root)
    for module in modules:
        importlib.import_module(f"loraplex.cli.{module}").register(built)
    _one_line_summaries(built)
    return built


def _one_line_summaries(app: typer.Typer) -> None:
    """Each command's summary in its group's listing: its help's whole first paragraph, as one
    line. NOTE: click's listing cuts a summary it makes at 45 characters (``...``), and typer's
    rich one broke `backup`'s after "the demo", mid-sentence; a command's own ``--help`` still
    shows the whole docstring."""
    for info in app.registered_commands:
        text = info.help or inspect.getdoc(info.callback) or ""
        if info.short_help is None:
            info.short_help = " ".join(text.split("\n\n")[0].split())
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


def _root() -> None:
    """loraplex command line."""


@functools.cache
def _full_app() -> typer.Typer:
    return build_app()


def __getattr__(name: str) -> typer.Typer:
    """``loraplex.cli.app``: every command, built once on first use."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _full_app()


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else None
    own = _OWN_MODULES.get(command) if command is not None else None
    (build_app(own) if own is not None else _full_app())()
