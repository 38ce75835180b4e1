"""What a new user reads names only what a fresh clone holds: every markdown file README.md and
docs/*.md point to exists in the repository, and no page asks the reader to know the project's
own working notes. architecture.md sent readers to ``DESIGN.md`` and operations.md (and the
``sim run --workload`` help) to ``WORKLOADS.md`` for the scenario names, files that live outside
the repository; README.md and the preflight pages called the launch checklist "the seeds'"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from loraplex.bench.workloads import SCENARIOS
from loraplex.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MD_NAME = re.compile(r"[A-Za-z0-9_./-]+\.md\b")


def _missing(page: Path) -> list[str]:
    """The ``*.md`` names on ``page`` that are no file at the root, under docs/ or beside it
    (a benchmark's report named by its ``--report-dir``, ``docs/benchmarks``)."""
    text = page.read_text(encoding="utf-8")
    places = (ROOT, ROOT / "docs", page.parent, ROOT / "docs" / "benchmarks")
    return sorted({n for n in _MD_NAME.findall(text) if not any((p / n).exists() for p in places)})


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_markdown_file_a_page_names_is_in_the_repository(page: Path) -> None:
    assert _missing(page) == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_page_cites_the_project_notes_as_the_seeds(page: Path) -> None:
    assert re.findall(r"\bthe seeds\b|\bseeds'", page.read_text(encoding="utf-8")) == []


def test_the_workload_help_names_every_scenario() -> None:
    run = typer.main.get_command(app).commands["sim"].commands["run"]  # type: ignore[attr-defined]
    (workload,) = [p for p in run.params if p.name == "workload"]
    assert "WORKLOADS.md" not in workload.help
    assert [name for name in sorted(SCENARIOS) if name not in workload.help] == []
