"""Files of the registry (issue 11, item 9): owner-only modes, and no leftovers of killed writes."""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from pathlib import Path

from registry_kit import AdapterFactory

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.store import fetch_to_file
from loraplex.registry import (
    LocalArtifactStore,
    RegistrationRequest,
    RegistryConfig,
    open_registry,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_data_dir_is_0700_and_its_files_0600(
    tmp_path: Path, base: BaseModelSpec, make_adapter: AdapterFactory
) -> None:
    data_dir = tmp_path / "fresh" / "data"
    registry = open_registry(RegistryConfig(data_dir), base)
    try:
        registry.create_tenant("acme", "ops")
        request = RegistrationRequest(make_adapter("a"), "acme", "bot", "v1")
        revision = registry.register(request, "ops").revision
        copy = registry.fetch(revision, data_dir / "cache" / "acme")
    finally:
        registry.close()

    artifacts = data_dir / "artifacts"
    assert _mode(data_dir) == 0o700
    assert _mode(data_dir / "registry.sqlite3") == 0o600
    objects = [p for p in (artifacts / "sha256").rglob("*") if p.is_file()]
    assert len(objects) == 2 and {_mode(p) for p in objects} == {0o600}
    folders = [artifacts, artifacts / "sha256", artifacts / "tmp"]
    folders += [p for p in (artifacts / "sha256").iterdir()]
    assert {_mode(p) for p in folders} == {0o700}
    assert {_mode(p) for p in copy.iterdir()} == {0o600}


def test_leftover_temporaries_are_removed_when_the_store_opens(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    leftover = store.root / "tmp" / f"{'ab' * 32}.0123456789abcdef"  # a killed put_file's name
    leftover.write_bytes(b"half an adapter")

    LocalArtifactStore(tmp_path / "store")

    assert list((store.root / "tmp").iterdir()) == []


def test_temporaries_of_a_write_under_way_are_kept(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    in_flight = store.root / "tmp" / f"{'cd' * 32}.0123456789abcdef"
    in_flight.write_bytes(b"being written")
    fd = os.open(store.root / "tmp.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # what put_file holds while its temporary exists
        LocalArtifactStore(tmp_path / "store")
        assert in_flight.exists()
    finally:
        os.close(fd)
    LocalArtifactStore(tmp_path / "store")
    assert not in_flight.exists()


def test_put_and_fetch_still_work_with_the_lock(tmp_path: Path) -> None:
    source = tmp_path / "blob"
    source.write_bytes(b"bytes")
    digest = hashlib.sha256(b"bytes").hexdigest()
    store = LocalArtifactStore(tmp_path / "store")
    store.put_file(source, digest)
    fetched = fetch_to_file(store, digest, tmp_path / "out" / "blob")
    assert fetched.read_bytes() == b"bytes" and _mode(fetched) == 0o600
    assert list((store.root / "tmp").iterdir()) == []
