"""``loraplex bench``: benchmark commands, one module per command or close group (execution,
cache and residency, serve, release, peer, fleet, traces, modes, front); the options several of
them take are declared once in ``options.py``. ``bench signing``, ``bench sim`` and
``bench baselines`` join this group from their own modules (``cli/signing.py``,
``cli/bench_sim.py``, ``cli/baselines.py``)."""

from __future__ import annotations

import typer

from loraplex.cli.bench import cache, execution, fleet, front, modes, peer, release, serve, traces

bench_app = typer.Typer(help="Benchmarks: one JSON line on stdout, a markdown report under docs/.")

# In this order in `loraplex bench --help`.
_COMMANDS = (
    ("execution", execution.execution),
    ("cache", cache.cache),
    ("residency", cache.residency),
    ("serve", serve.serve),
    ("release", release.release),
    ("peer", peer.peer),
    ("fleet", fleet.fleet),
    ("traces", traces.traces),
    ("modes", modes.modes),
    ("front", front.front),
)
for _name, _command in _COMMANDS:
    bench_app.command(_name)(_command)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
