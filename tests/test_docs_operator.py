"""What docs/operations.md, *Upgrades, backups and key rotation* and `loraplex backup`, quotes
of the commands' own output is what they print: the four lines of ``loraplex backup`` and the
line a registry upgrade writes on stderr (numbers and paths are placeholders there)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.registry import RegistryConfig, open_registry
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.migrations import MIGRATIONS, migrate

OPS = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text(encoding="utf-8")
TEXT = re.sub(r"\s*\n\s*", " ", OPS)  # wrapped lines joined: a quote may span two lines


def _quoted_after(lead: str) -> list[str]:
    start = TEXT.index(lead) + len(lead)
    sentence = TEXT[start : TEXT.index(". ", start)]
    return re.findall(r"`([^`]+)`", sentence)


def _pattern(quote: str, placeholders: dict[str, str]) -> re.Pattern[str]:
    pattern = re.escape(quote)
    for placeholder, value in placeholders.items():
        pattern = pattern.replace(re.escape(placeholder), value)
    return re.compile(pattern)


def test_the_documented_backup_lines_are_what_it_prints(tmp_path: Path) -> None:
    data = tmp_path / "data"
    open_registry(RegistryConfig(data)).close()
    (data / "admin-key").write_text("lpxadmin_0123456789abcdef\n")
    (data / "demo-assets").mkdir()
    dest = tmp_path / "bak"
    result = CliRunner().invoke(app, ["backup", str(dest), "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    printed = result.output.splitlines()
    quotes = _quoted_after("It prints four lines:")
    assert len(quotes) == 4 == len(printed), (quotes, printed)
    for quote, line in zip(quotes, printed, strict=True):
        values = {"DEST": re.escape(str(dest)), " N": r" \d+", " B ": r" \d+ "}
        assert _pattern(quote, values).fullmatch(line), (quote, line)


def test_the_documented_upgrade_line_is_what_a_migration_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (quote,) = [q for q in _quoted_after("which prints") if "schema upgraded" in q]
    db = open_database(f"sqlite:///{tmp_path / 'r.sqlite3'}")
    try:
        migrate(db, now=1.0, migrations=MIGRATIONS[:1])
        with caplog.at_level(logging.WARNING, logger="loraplex.registry.sql.migrations"):
            migrate(db, now=2.0)
    finally:
        db.close()
    values = {"sqlite:///...": "sqlite:///.+", "version 1 to 7": r"version \d+ to \d+"}
    assert _pattern(quote, values).fullmatch(caplog.messages[0]), (quote, caplog.messages)


def test_the_documented_tenant_quotas_are_the_admin_apis() -> None:
    """*Endpoints* names every quota ``PUT /admin/tenants/{tenant}`` takes (it named five of the
    eight, leaving out ``max_cpu_bytes``, ``max_disk_bytes`` and ``max_cold_loads``)."""
    from loraplex.server.admin_models import QuotasBody, TenantBody

    lead = "the quotas are the eight of `tenants create`:"
    start = TEXT.index(lead) + len(lead)
    named = re.findall(r"`(\w+)`", TEXT[start : TEXT.index(";", start)])
    assert named == list(QuotasBody.model_fields)
    body = TEXT[TEXT.index("`POST /admin/tenants` (`") :].split("`")[3]
    assert re.findall(r'"(\w+)"', body) == list(TenantBody.model_fields)
