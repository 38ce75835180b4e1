"""Secrets of ``loraplex serve`` (issue 11, item 9): tenant keys exist in plain text only when
issued, never in a file, and a restart prints none; the admin key file is owner-only."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from loraplex.cli import serve
from loraplex.registry import Registry, RegistryConfig, open_registry
from loraplex.serve.bootstrap import (
    ADMIN_KEY_FILE,
    LEGACY_SAMPLE_KEYS_FILE,
    admin_key,
    sample_keys,
)
from loraplex.serve.config import ServeConfig

TENANTS = ("acme", "globex")


def fresh_registry(data_dir: Path, tenants: tuple[str, ...]) -> Registry:
    registry = open_registry(RegistryConfig(data_dir))
    for tenant in tenants:
        registry.create_tenant(tenant, "test")
    return registry


def test_tenant_keys_are_issued_once_and_kept_nowhere(tmp_path: Path) -> None:
    registry = fresh_registry(tmp_path / "data", TENANTS)
    legacy = tmp_path / "data" / LEGACY_SAMPLE_KEYS_FILE
    legacy.write_text(json.dumps({"acme": "lpx_old_secret"}))
    try:
        first = sample_keys(registry, TENANTS, tmp_path / "data")
        assert set(first) == set(TENANTS)
        assert all(registry.authenticate(first[t]).name == t for t in TENANTS)
        restart = sample_keys(registry, TENANTS, tmp_path / "data")
        registry.revoke_key(first["acme"].split("_")[1], "test")  # lpx_<key_id>_<secret>
        after_revoke = sample_keys(registry, TENANTS, tmp_path / "data")

        assert restart == {}
        assert after_revoke == {}  # NOTE: a revoked-out demo tenant got a new key every start
        assert not legacy.exists()
        stored = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
        assert not any(token.encode() in stored for token in first.values())
    finally:
        registry.close()


def test_a_restart_prints_no_secret(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    settings = ServeConfig(data_dir=tmp_path)
    serve._announce(settings, "admin-credential", {"acme": "lpx_new_token"})
    first = capsys.readouterr().out
    serve._announce(settings, None, {})
    restart = capsys.readouterr().out

    assert "lpx_new_token" in first and "admin-credential" in first
    assert "lpx_" not in restart and "loraplex keys create" in restart
    assert "admin-credential" not in restart and "admin-key" in restart
    # on the data dir it serves: a bare `keys create` after `serve --data-dir D` read the default
    assert f"`loraplex keys create TENANT --data-dir {tmp_path}` makes one" in restart


def test_the_key_hint_names_the_loraplex_the_operator_ran(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``serve``'s hint said a bare ``loraplex`` (as ``fleet up``'s did): "command not found"
    for an operator who ran ``.venv/bin/loraplex serve`` in a shell without that venv active.
    A data dir with a space is quoted, so the hint pastes as one command."""
    script = tmp_path / "venv" / "bin" / "loraplex"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    script.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("PATH", str(elsewhere))  # no loraplex on PATH
    monkeypatch.setattr("sys.argv", [str(script), "serve"])
    data = tmp_path / "my data"
    serve._announce(ServeConfig(data_dir=data), None, {})
    out = capsys.readouterr().out
    assert f"`{script} keys create TENANT --data-dir '{data}'` makes one" in out
    monkeypatch.setenv("PATH", str(script.parent))  # the same loraplex is on PATH: bare
    serve._announce(ServeConfig(data_dir=data), None, {})
    assert f"`loraplex keys create TENANT --data-dir '{data}'`" in capsys.readouterr().out


def test_admin_key_file_and_fresh_data_dir_are_owner_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / "data"
    key = admin_key(data_dir)
    assert admin_key(data_dir) == key
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / ADMIN_KEY_FILE).stat().st_mode) == 0o600


@pytest.mark.parametrize("saved", ["short", "lpx_0123456789abcdef0123"])
def test_an_invalid_saved_admin_key_names_its_file(tmp_path: Path, saved: str) -> None:
    # an operator rotating the admin key writes the file; the error must say which file
    (tmp_path / ADMIN_KEY_FILE).write_text(saved + "\n")
    with pytest.raises(ValueError, match="admin-key: the saved admin key is invalid") as raised:
        admin_key(tmp_path)
    assert str(tmp_path / ADMIN_KEY_FILE) in str(raised.value)
    assert (tmp_path / ADMIN_KEY_FILE).read_text() == saved + "\n"  # left as it was


def test_the_dashboard_is_announced_on_the_admin_socket(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``serve`` printed no dashboard address (``fleet up`` did); it is on the admin socket when
    there is one (the API socket answers /admin with 404 then)."""
    serve._announce(ServeConfig(data_dir=tmp_path), None, {})
    plain = capsys.readouterr().out
    serve._announce(ServeConfig(data_dir=tmp_path, admin_port=8001), None, {})
    split = capsys.readouterr().out

    assert "dashboard:  http://127.0.0.1:8000/admin/dashboard#key=<admin key>" in plain
    assert "dashboard:  http://127.0.0.1:8001/admin/dashboard#key=<admin key>" in split
    assert "/metrics only on http://127.0.0.1:8001" in split
