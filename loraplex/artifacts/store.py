"""Content-addressed artifact stores: the ``ArtifactStore`` protocol and the local directory store.

Objects are named by the sha256 of their bytes and nothing else, so an object can be written by
any number of concurrent registrations (same bytes, same name) and a reader can always check what
it got. Writes are atomic (an object is visible complete or not at all); reads stream and raise
``DigestMismatchError`` when the bytes do not hash to the name they were read under.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from loraplex.artifacts.identity import sha256_file
from loraplex.errors import ArtifactNotFoundError, DigestMismatchError, PathOutsideStoreError

CHUNK_BYTES = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Stored bytes are tenants' private adapters: directories 0700, files 0600 (owner only).
DIR_MODE = 0o700
FILE_MODE = 0o600


class ArtifactStore(Protocol):
    """Where adapter files live (L3). Implementations: local directory, S3-compatible storage."""

    @property
    def url(self) -> str:
        """Where the store is, recorded with every revision (``file://...``, ``s3://...``)."""
        ...

    def put_file(self, path: Path, digest: str) -> None:
        """Store ``path``'s bytes as object ``digest``, atomically; idempotent.

        Raises ``DigestMismatchError`` (and stores nothing) when the bytes hash differently.
        """
        ...

    def exists(self, digest: str) -> bool:
        """Whether a complete object named ``digest`` is stored."""
        ...

    def read(self, digest: str) -> Iterator[bytes]:
        """Stream an object's bytes; ``ArtifactNotFoundError`` if absent.

        Raises ``DigestMismatchError`` after the last chunk when the bytes do not hash to
        ``digest``: consumers must not trust the data until the iterator is exhausted.
        """
        ...

    def digests(self) -> Iterator[str]:
        """Every stored object's digest (for garbage collection and audits)."""
        ...

    def delete(self, digest: str) -> None:
        """Remove an object; absent objects are ignored."""
        ...


def check_digest(digest: str) -> str:
    """Object names derive from digests only; anything else could address outside the store."""
    if not _HEX64.fullmatch(digest):
        raise PathOutsideStoreError(
            f"object name {digest!r} is not a sha256 digest (64 lowercase hex digits); "
            "store paths are derived from digests only"
        )
    return digest


def verified_chunks(chunks: Iterable[bytes], digest: str, what: str) -> Iterator[bytes]:
    """Pass ``chunks`` through, raising ``DigestMismatchError`` at the end if they mismatch."""
    hasher = hashlib.sha256()
    for chunk in chunks:
        hasher.update(chunk)
        yield chunk
    actual = hasher.hexdigest()
    if actual != digest:
        raise DigestMismatchError(what, digest, actual)


def fetch_to_file(store: ArtifactStore, digest: str, dest: Path) -> Path:
    """Download object ``digest`` to ``dest``; ``dest`` appears only once verified."""
    dest.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    temp = dest.with_name(f".{dest.name}.{secrets.token_hex(8)}.part")
    try:
        with private_file(temp) as handle:
            for chunk in store.read(digest):
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, dest)
    finally:
        temp.unlink(missing_ok=True)
    return dest


def private_file(path: Path) -> io.BufferedWriter:
    """A new file only its owner can read (0600), open for writing."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "wb")


class LocalArtifactStore:
    """Objects as files under ``root/sha256/<first two hex digits>/<digest>``.

    Temporary files live in ``root/tmp`` (same file system, so ``os.replace`` is atomic); a
    crash can leave temporaries there but never a partial object under ``sha256/``. Opening the
    store removes such leftovers. NOTE: several processes may share the store, so a write holds
    ``root/tmp.lock`` shared while its temporary exists, and the sweep runs only when it can
    take that lock exclusively at once (otherwise a later open sweeps).
    """

    def __init__(self, root: Path) -> None:
        self._root = root.resolve()
        self._root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        (self._root / "sha256").mkdir(mode=DIR_MODE, exist_ok=True)
        (self._root / "tmp").mkdir(mode=DIR_MODE, exist_ok=True)
        self._sweep_temporaries()

    @property
    def root(self) -> Path:
        return self._root

    @property
    def url(self) -> str:
        return self._root.as_uri()

    def path_for(self, digest: str) -> Path:
        """The object's file path; ``PathOutsideStoreError`` if it would leave the root."""
        check_digest(digest)
        path = self._root / "sha256" / digest[:2] / digest
        if not path.resolve().is_relative_to(self._root):
            raise PathOutsideStoreError(f"{path} resolves outside the store root {self._root}")
        return path

    def put_file(self, path: Path, digest: str) -> None:
        target = self.path_for(digest)
        if target.exists() and sha256_file(target) == digest:
            return
        target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        temp = self._root / "tmp" / f"{digest}.{secrets.token_hex(8)}"
        with self._tmp_lock(fcntl.LOCK_SH):
            try:
                actual = _copy_hashing(path, temp)
                if actual != digest:
                    raise DigestMismatchError(str(path), digest, actual)
                os.replace(temp, target)
                _fsync_dir(target.parent)
            finally:
                temp.unlink(missing_ok=True)

    def exists(self, digest: str) -> bool:
        return self.path_for(digest).is_file()

    def read(self, digest: str) -> Iterator[bytes]:
        path = self.path_for(digest)
        try:
            handle = path.open("rb")
        except FileNotFoundError as exc:
            raise ArtifactNotFoundError(
                f"artifact store {self.url} has no object {digest}"
            ) from exc
        with handle:
            yield from verified_chunks(
                iter(lambda: handle.read(CHUNK_BYTES), b""), digest, str(path)
            )

    def digests(self) -> Iterator[str]:
        for path in sorted((self._root / "sha256").glob("*/*")):
            if _HEX64.fullmatch(path.name) and path.parent.name == path.name[:2]:
                yield path.name

    def delete(self, digest: str) -> None:
        self.path_for(digest).unlink(missing_ok=True)

    def _sweep_temporaries(self) -> None:
        """Removes what killed writes left in ``tmp/``, unless a write is under way now."""
        with contextlib.suppress(BlockingIOError), self._tmp_lock(fcntl.LOCK_EX | fcntl.LOCK_NB):
            for leftover in (self._root / "tmp").iterdir():
                leftover.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _tmp_lock(self, operation: int) -> Iterator[None]:
        """``flock`` on ``root/tmp.lock`` (released when the descriptor closes, or the process
        dies); ``BlockingIOError`` when ``LOCK_NB`` is asked and another process holds it."""
        fd = os.open(self._root / "tmp.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, operation)
            yield
        finally:
            os.close(fd)


def _copy_hashing(source: Path, dest: Path) -> str:
    hasher = hashlib.sha256()
    with source.open("rb") as reader, private_file(dest) as writer:
        while chunk := reader.read(CHUNK_BYTES):
            hasher.update(chunk)
            writer.write(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return hasher.hexdigest()


def _fsync_dir(path: Path) -> None:
    """Make a rename durable: the directory entry must reach the disk, not just the file."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
