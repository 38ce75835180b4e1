"""The admin key kept in ``<data dir>/admin-key`` is re-read when the file changes, so it can be
rotated without a restart; an invalid new key is logged and the key in force kept; a key given
by ``--admin-key`` is fixed."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import ADMIN_KEY, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient

from loraplex.clock import ManualClock
from loraplex.release.traffic import ReleaseTraffic
from loraplex.serve.assembly import build_server
from loraplex.serve.bootstrap import ADMIN_KEY_FILE
from loraplex.serve.config import ServeConfig
from loraplex.server.admin_key import CHECK_INTERVAL_S, AdminKey
from loraplex.server.app import create_app

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

NEW_KEY = "rotated-admin-credential-9876543210"
LOGGER = "loraplex.server.admin_key"


def _write(path: Path, text: str) -> None:
    """As an operator should: a new file renamed over the old one."""
    staged = path.with_name(".staged")
    staged.write_text(text, encoding="utf-8")
    staged.replace(path)


def _status(http: TestClient, key: str) -> tuple[int, int]:
    auth = {"Authorization": f"Bearer {key}"}
    return (
        http.get("/admin/tenants", headers=auth).status_code,
        http.get("/metrics", headers=auth).status_code,
    )


def test_a_rotated_key_file_takes_over_while_serving(served: Served, tmp_path: Path) -> None:
    path = tmp_path / ADMIN_KEY_FILE
    _write(path, ADMIN_KEY + "\n")
    clock = ManualClock()
    deps = make_app_deps(
        served, FakeEngine(), admin_key_file=path, releases=ReleaseTraffic(clock, tuple)
    )
    with TestClient(create_app(deps)) as http:
        assert _status(http, ADMIN_KEY) == (200, 200)
        _write(path, NEW_KEY + "\n")
        clock.advance(CHECK_INTERVAL_S / 2)  # not looked at yet: the old key still works
        assert _status(http, ADMIN_KEY) == (200, 200)
        clock.advance(CHECK_INTERVAL_S)
        assert _status(http, NEW_KEY) == (200, 200)
        assert _status(http, ADMIN_KEY) == (401, 401)
        # the tenant routes tell the new admin key's holder what to send, and the old one nothing
        told = http.get("/v1/models", headers={"Authorization": f"Bearer {NEW_KEY}"})
        assert "this is the admin key" in told.json()["error"]["message"]
        old = http.get("/v1/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert old.json()["error"]["message"] == "invalid API key"
        assert _reloads(http, NEW_KEY) == {"reloaded": 1, "invalid": 0, "unreadable": 0}
        _write(path, "short\n")  # a failed rotation: counted, the key in force kept
        clock.advance(CHECK_INTERVAL_S)
        assert _reloads(http, NEW_KEY) == {"reloaded": 1, "invalid": 1, "unreadable": 0}
        path.unlink()
        clock.advance(CHECK_INTERVAL_S)
        assert _reloads(http, NEW_KEY) == {"reloaded": 1, "invalid": 1, "unreadable": 1}


def _reloads(http: TestClient, key: str) -> dict[str, int]:
    """``loraplex_admin_key_reloads_total`` by outcome, as /metrics shows it."""
    text = http.get("/metrics", headers={"Authorization": f"Bearer {key}"}).text
    found = {}
    for line in text.splitlines():
        if line.startswith("loraplex_admin_key_reloads_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            found[outcome] = int(float(line.rsplit(" ", 1)[1]))
    return found


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        ("", "holds an invalid key (0 characters"),
        ("short\n", "holds an invalid key (5 characters"),
        ("lpx_looks-like-a-tenant-token-000\n", "not starting with 'lpx_'"),
        (None, "cannot be read"),  # the file deleted
    ],
)
def test_an_invalid_new_key_is_logged_and_the_old_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str | None, logged: str
) -> None:
    path = tmp_path / ADMIN_KEY_FILE
    _write(path, ADMIN_KEY)
    clock = ManualClock()
    admin = AdminKey(ADMIN_KEY, path, clock)
    if text is None:
        path.unlink()
    else:
        _write(path, text)
    clock.advance(CHECK_INTERVAL_S)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert admin.current() == ADMIN_KEY
        clock.advance(CHECK_INTERVAL_S)
        assert admin.current() == ADMIN_KEY  # unchanged since: not logged again
    (record,) = caplog.records
    outcome = "unreadable" if text is None else "invalid"
    assert admin.reloads() == {"reloaded": 0, "invalid": 0, "unreadable": 0} | {outcome: 1}
    assert record.levelno == logging.ERROR
    assert logged in record.getMessage() and str(path) in record.getMessage()
    assert "the admin key in force is kept" in record.getMessage()
    # a valid key written after the bad one is taken
    _write(path, NEW_KEY)
    clock.advance(CHECK_INTERVAL_S)
    assert admin.current() == NEW_KEY


def test_the_file_is_read_only_when_it_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ADMIN_KEY_FILE
    _write(path, ADMIN_KEY)
    reads: list[Path] = []
    read_text = Path.read_text

    def counted(self: Path, *args: Any, **kwargs: Any) -> str:
        reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    clock = ManualClock()
    admin = AdminKey(ADMIN_KEY, path, clock)
    assert admin.current() == ADMIN_KEY and reads == []  # not due yet: not even a stat
    clock.advance(CHECK_INTERVAL_S)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert admin.current() == ADMIN_KEY  # the same key: nothing to say
        for _ in range(3):  # unchanged: looked at, never read again
            clock.advance(CHECK_INTERVAL_S)
            assert admin.current() == ADMIN_KEY
        assert reads == [path]
        # rewritten in place, same size, mtime put back: the ctime still tells
        stat = path.stat()
        path.write_text(NEW_KEY[: len(ADMIN_KEY)], encoding="utf-8")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        clock.advance(CHECK_INTERVAL_S)
        assert admin.current() == NEW_KEY[: len(ADMIN_KEY)] and len(reads) == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"admin key reloaded from {path}: the previous key no longer works"
    ]
    # the first look (the same key as in force) is no reload; the rewrite is one
    assert admin.reloads() == {"reloaded": 1, "invalid": 0, "unreadable": 0}


def test_a_fixed_key_never_looks_at_a_file(tmp_path: Path) -> None:
    clock = ManualClock()
    admin = AdminKey(ADMIN_KEY, None, clock)
    clock.advance(100 * CHECK_INTERVAL_S)
    assert admin.current() == ADMIN_KEY and admin.path is None


def _serve(assets: DemoAssets, data_dir: Path, admin_key: str | None) -> ServeConfig:
    return ServeConfig(
        data_dir=data_dir,
        model=assets.base_model_dir,
        demo=False,
        admin_key=admin_key,
        max_loras=2,
        max_num_seqs=2,
        engine_process=False,
    )


def test_serve_rotates_a_kept_key_and_keeps_a_given_one(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Through ``build_server`` on the real clock: the new key is polled for, not timed."""
    given = build_server(_serve(demo_assets, tmp_path / "given", ADMIN_KEY))
    try:
        assert given.deps.admin.path is None  # --admin-key / LORAPLEX_ADMIN_KEY: fixed
    finally:
        given.close()
    data_dir = tmp_path / "kept"
    server = build_server(_serve(demo_assets, data_dir, None))
    try:
        path = data_dir / ADMIN_KEY_FILE
        assert server.deps.admin.path == path
        with TestClient(server.app) as http:
            assert _status(http, server.admin_key) == (200, 200)
            _write(path, NEW_KEY + "\n")
            deadline = time.monotonic() + 60  # a bound to fail instead of hanging
            while _status(http, NEW_KEY) != (200, 200):
                assert time.monotonic() < deadline, "the rotated key was never taken"
                time.sleep(0.1)
            assert _status(http, server.admin_key) == (401, 401)
    finally:
        server.close()
