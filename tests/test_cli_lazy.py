"""``loraplex serve`` builds its command alone: the same command as in the full app, without
importing the other command modules (their import was on the start's critical path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

import loraplex.cli as cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(cli._OWN_MODULES))
def test_an_own_module_command_equals_the_full_apps(name: str) -> None:
    full = typer.main.get_command(cli.app)
    alone = typer.main.get_command(cli.build_app(cli._OWN_MODULES[name]))
    assert isinstance(full, typer.main.TyperGroup) and isinstance(alone, typer.main.TyperGroup)
    assert list(alone.commands) == [name]  # the module registers nothing else
    want, got = full.commands[name], alone.commands[name]
    assert got.callback is not None and want.callback is not None
    assert (got.callback.__module__, got.callback.__name__, got.help) == (
        want.callback.__module__,
        want.callback.__name__,
        want.help,
    )
    assert [p.name for p in got.params] == [p.name for p in want.params]
    # and no other module adds to or replaces that command in the full app
    modules = {c.callback.__module__ for c in full.commands.values() if c.callback is not None}
    owners = {f"loraplex.cli.{m}" for m in cli._OWN_MODULES[name]}
    assert want.callback.__module__ in owners
    assert len(modules) > 1


def test_serve_imports_no_other_command_module() -> None:
    code = (
        "import sys\n"
        "sys.argv = ['loraplex', 'serve', '--help']\n"
        "from loraplex.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('loraplex.cli.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "--config" in out  # serve's own help
    loaded = out.strip().splitlines()[-1]
    assert "loraplex.cli.serve'" in loaded
    for other in ("bench", "registry", "fleet", "demo", "sim", "qualify"):
        assert f"loraplex.cli.{other}'" not in loaded
