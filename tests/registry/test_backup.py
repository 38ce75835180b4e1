"""``loraplex backup``: a copy of a SQLite data directory taken while a registry has it open
(commits still in the WAL file) opens as the same registry; what it cannot copy is refused by
name."""

from __future__ import annotations

import stat
from pathlib import Path

from registry_kit import AdapterFactory
from typer.testing import CliRunner

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli import app
from loraplex.registry import RegistrationRequest, RegistryConfig, open_registry
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.migrations import MIGRATIONS, migrate


def _backup(data_dir: Path, dest: Path, *extra: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, ["backup", str(dest), "--data-dir", str(data_dir), *extra])
    assert result.exit_code == code, result.output
    return result.output


def test_a_backup_taken_while_open_restores_tenants_keys_and_adapters(
    tmp_path: Path, base: BaseModelSpec, make_adapter: AdapterFactory
) -> None:
    data = tmp_path / "data"
    live = open_registry(RegistryConfig(data), base)  # stays open: no checkpoint on close
    try:
        live.create_tenant("acme", "t")
        token = live.create_key("acme", "t").token
        request = RegistrationRequest(make_adapter("a"), "acme", "bot", "v1")
        revision = live.register(request, "t").revision
        (data / "admin-key").write_text("lpxadmin_saved-admin-key\n")
        assert (data / "registry.sqlite3-wal").stat().st_size > 0  # the commits are in the WAL
        out = _backup(data, tmp_path / "bak")
    finally:
        live.close()

    dest = tmp_path / "bak"
    assert f"registry   {dest / 'registry.sqlite3'} (schema version" in out
    assert "artifacts  2 objects," in out
    assert "files      admin-key" in out
    assert not (dest / "registry.sqlite3-wal").exists()  # one self-contained file
    assert stat.S_IMODE((dest / "artifacts").stat().st_mode) == 0o700
    assert stat.S_IMODE((dest / "admin-key").stat().st_mode) == 0o600
    assert (dest / "admin-key").read_text() == "lpxadmin_saved-admin-key\n"
    restored = open_registry(RegistryConfig(dest), base)
    try:
        assert [t.name for t in restored.list_tenants()] == ["acme"]
        assert restored.authenticate(token).name == "acme"
        assert restored.list_revisions("acme", "bot") == [revision]
        fetched = restored.fetch(revision, tmp_path / "fetched")
        original = request.adapter_dir / "adapter_model.safetensors"
        assert (fetched / "adapter_model.safetensors").read_bytes() == original.read_bytes()
    finally:
        restored.close()


def test_backup_refuses_what_it_cannot_copy_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    open_registry(RegistryConfig(data)).close()
    dest = tmp_path / "bak"
    pg = ("--database-url", "postgresql://u@127.0.0.1:1/db")
    assert "database_url: loraplex backup copies a SQLite registry only" in _backup(
        data, dest, *pg, code=1
    )
    assert "no registry at" in _backup(tmp_path / "nowhere", dest, code=1)
    assert not dest.exists()
    dest.mkdir()
    (dest / "old").write_text("x")
    assert f"{dest} is not empty" in _backup(data, dest, code=1)
    assert sorted(p.name for p in dest.iterdir()) == ["old"]
    bogus = tmp_path / "bogus"
    bogus.mkdir()
    (bogus / "registry.sqlite3").write_bytes(b"not a database" * 100)
    out = _backup(bogus, tmp_path / "bak2", code=1)
    assert out.startswith(f"error: {bogus / 'registry.sqlite3'}: file is not a database;"), out


def test_a_registry_an_older_loraplex_made_is_backed_up_as_it_is(tmp_path: Path) -> None:
    # the backup an operator takes before an upgrade: schema 1, no signature columns yet
    data = tmp_path / "data"
    data.mkdir()
    db = open_database(f"sqlite:///{data / 'registry.sqlite3'}")
    try:
        migrate(db, now=1.0, migrations=MIGRATIONS[:1])
    finally:
        db.close()
    out = _backup(data, tmp_path / "bak")
    assert "(schema version 1)" in out  # copied, not migrated
