"""The ``loraplex`` command. Environment variables and argv are read here (and in the modules of
this package) only; every other module receives plain, typed arguments.

Each module in ``_COMMAND_MODULES`` defines ``register(app)``, adding its commands or groups.
Heavy imports (torch, transformers) happen inside command bodies so ``--help`` stays fast.
"""

from __future__ import annotations

import importlib

import typer

_COMMAND_MODULES: tuple[str, ...] = (
    "demo",
    "assets",
    "generate",
    "registry",
    "tenants",
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

app = typer.Typer(
    name="loraplex",
    help="Serve one base LLM with thousands of LoRA adapters for many tenants.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """loraplex command line."""


for _module in _COMMAND_MODULES:
    importlib.import_module(f"loraplex.cli.{_module}").register(app)


def main() -> None:
    app()
