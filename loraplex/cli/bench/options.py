"""The options several ``loraplex bench`` commands take, declared once (typed ``Annotated``
aliases, as ``cli/serve_options.py`` does): same name, type and help wherever they appear; each
command keeps its own default. Options whose help names the command's own files or assets
(``--asset-dir``, ``--report-dir``, ``--seed``) stay with their command.

Also the small steps every command repeats: a config's ``ValueError`` shown as a bad parameter,
comma-separated names, the report folder and its ``<name>-run.md``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.assets import preset_option

AsJson = Annotated[bool, typer.Option("--json", help="Print only the JSON line.")]
Preset = Annotated[
    str, typer.Option(help="Demo preset whose shapes the model has.", parser=preset_option)
]
Threads = Annotated[int, typer.Option(help="torch threads (1 is stable on shared cores).")]
Rounds = Annotated[int, typer.Option(help="Interleaved timing rounds.")]
Rate = Annotated[
    float | None,
    typer.Option(help="Mean requests per second of each trace; unset: load x capacity."),
]
RequestTimeoutS = Annotated[
    float, typer.Option(help="Bound on every request; failures count at this TTFT.")
]
ASSET_DIR = Path(".loraplex-assets")  # the default of every command's --asset-dir
REPORT_DIR = "docs/benchmarks"  # the default of the commands' --report-dir


@contextlib.contextmanager
def bad_parameter() -> Iterator[None]:
    """A ``ValueError`` raised inside (a config refusing a value) as typer's ``BadParameter``:
    the usage and the message on stderr, exit status 2."""
    try:
        yield
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def names(value: str | None) -> tuple[str, ...] | None:
    """The names of a comma-separated option, blanks dropped; None when it was not given."""
    return None if value is None else tuple(n.strip() for n in value.split(",") if n.strip())


def report_folder(report_dir: str) -> Path | None:
    """The folder a report goes to, created; None when ``report_dir`` is '' (no report)."""
    if not report_dir:
        return None
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_report(out: Path, name: str, title: str, markdown: str) -> None:
    """``<out>/<name>-run.md``: the latest run's markdown report under ``title``."""
    (out / f"{name}-run.md").write_text(f"# {title}: latest run\n\n" + markdown, encoding="utf-8")


def logs_dir_ready(path: Path) -> None:
    """Creates ``path``; one that holds anything is refused (its files would be overwritten)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--logs-dir {path} is invalid; expected a new or empty directory")
    path.mkdir(parents=True, exist_ok=True)
