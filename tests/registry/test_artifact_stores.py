"""Both artifact stores: content addressing, atomic writes, streamed verified reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from registry_kit import S3Target

from loraplex.artifacts.store import (
    CHUNK_BYTES,
    ArtifactStore,
    LocalArtifactStore,
    fetch_to_file,
)
from loraplex.errors import ArtifactNotFoundError, DigestMismatchError, PathOutsideStoreError
from loraplex.registry.s3 import S3ArtifactStore


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "local":
        return LocalArtifactStore(tmp_path / "store")
    target: S3Target = request.getfixturevalue("s3_target")
    return S3ArtifactStore(target.bucket, "some/prefix", endpoint_url=target.endpoint)


def _file(tmp_path: Path, data: bytes, name: str = "blob") -> tuple[Path, str]:
    path = tmp_path / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def _corrupt(store: ArtifactStore, digest: str, request: pytest.FixtureRequest) -> bytes:
    """Replace the stored bytes behind the store's back; returns what is stored now."""
    tampered = b"tampered"
    if isinstance(store, LocalArtifactStore):
        store.path_for(digest).write_bytes(tampered)
        return tampered
    assert isinstance(store, S3ArtifactStore)
    target: S3Target = request.getfixturevalue("s3_target")
    target.client.put_object(Bucket=target.bucket, Key=store.object_key(digest), Body=tampered)
    return tampered


def test_put_then_read_round_trips_and_lists(store: ArtifactStore, tmp_path: Path) -> None:
    path, digest = _file(tmp_path, b"adapter bytes")
    assert not store.exists(digest)
    store.put_file(path, digest)
    store.put_file(path, digest)  # idempotent
    assert store.exists(digest)
    assert b"".join(store.read(digest)) == b"adapter bytes"
    assert list(store.digests()) == [digest]
    store.delete(digest)
    assert not store.exists(digest)
    assert list(store.digests()) == []


def test_large_object_reads_stream_in_chunks(store: ArtifactStore, tmp_path: Path) -> None:
    data = os.urandom(CHUNK_BYTES * 2 + 123)
    path, digest = _file(tmp_path, data)
    store.put_file(path, digest)
    chunks = list(store.read(digest))
    assert len(chunks) >= 2
    assert all(len(chunk) <= CHUNK_BYTES for chunk in chunks)
    assert b"".join(chunks) == data


def test_put_with_wrong_digest_stores_nothing(store: ArtifactStore, tmp_path: Path) -> None:
    path, _ = _file(tmp_path, b"real bytes")
    claimed = hashlib.sha256(b"other bytes").hexdigest()
    with pytest.raises(DigestMismatchError, match=claimed):
        store.put_file(path, claimed)
    assert not store.exists(claimed)
    assert list(store.digests()) == []


def test_read_of_tampered_object_raises_digest_mismatch(
    store: ArtifactStore, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path, digest = _file(tmp_path, b"original")
    store.put_file(path, digest)
    tampered = _corrupt(store, digest, request)
    with pytest.raises(DigestMismatchError) as info:
        b"".join(store.read(digest))
    assert info.value.expected == digest
    assert info.value.actual == hashlib.sha256(tampered).hexdigest()


def test_fetch_of_tampered_object_leaves_no_file(
    store: ArtifactStore, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path, digest = _file(tmp_path, b"original")
    store.put_file(path, digest)
    dest = tmp_path / "out" / "adapter_model.safetensors"
    assert fetch_to_file(store, digest, dest).read_bytes() == b"original"
    dest.unlink()
    _corrupt(store, digest, request)
    with pytest.raises(DigestMismatchError):
        fetch_to_file(store, digest, dest)
    assert list((tmp_path / "out").iterdir()) == []


def test_put_repairs_a_tampered_object(
    store: ArtifactStore, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path, digest = _file(tmp_path, b"original")
    store.put_file(path, digest)
    _corrupt(store, digest, request)
    store.put_file(path, digest)
    assert b"".join(store.read(digest)) == b"original"


def test_missing_object_raises_not_found(store: ArtifactStore) -> None:
    digest = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(ArtifactNotFoundError, match=digest):
        list(store.read(digest))


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "AB" * 32, "ab" * 31, "ab" * 32 + "/../x", ""]
)
def test_names_that_are_not_digests_are_refused(
    store: ArtifactStore, tmp_path: Path, name: str
) -> None:
    path, _ = _file(tmp_path, b"x")
    with pytest.raises(PathOutsideStoreError, match="not a sha256 digest"):
        store.put_file(path, name)
    with pytest.raises(PathOutsideStoreError):
        store.exists(name)
    with pytest.raises(PathOutsideStoreError):
        list(store.read(name))


def test_local_store_refuses_a_fan_out_dir_linked_outside(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    path, digest = _file(tmp_path, b"payload")
    (store.root / "sha256" / digest[:2]).symlink_to(outside, target_is_directory=True)
    with pytest.raises(PathOutsideStoreError, match="outside the store root"):
        store.put_file(path, digest)
    assert list(outside.iterdir()) == []


def test_local_store_writes_leave_no_temporaries(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    path, digest = _file(tmp_path, b"payload")
    store.put_file(path, digest)
    with pytest.raises(DigestMismatchError):
        store.put_file(path, "0" * 64)
    assert list((store.root / "tmp").iterdir()) == []
    assert store.path_for(digest).read_bytes() == b"payload"
    assert store.url == store.root.as_uri()


def test_s3_store_keys_live_under_the_prefix(s3_target: S3Target, tmp_path: Path) -> None:
    store = S3ArtifactStore(s3_target.bucket, "/team/a/", endpoint_url=s3_target.endpoint)
    path, digest = _file(tmp_path, b"payload")
    store.put_file(path, digest)
    listed = s3_target.client.list_objects_v2(Bucket=s3_target.bucket)["Contents"]
    assert [entry["Key"] for entry in listed] == [f"team/a/sha256/{digest}"]
    assert store.url == f"s3://{s3_target.bucket}/team/a/"
