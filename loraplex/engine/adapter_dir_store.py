"""The artifact store of an offline engine (``offline.py``): the caller's adapter directories,
read where they are."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from loraplex.artifacts.store import CHUNK_BYTES, verified_chunks
from loraplex.errors import ArtifactNotFoundError


class AdapterDirStore:
    """An ArtifactStore over files that stay where they are (the caller's adapter directories).

    ``put_file`` records a file under its digest instead of copying it; reads verify the bytes
    against the digest, as every store's reads do, so a file edited after validation fails to
    load rather than serving other weights than were checked.
    """

    def __init__(self) -> None:
        self._paths: dict[str, Path] = {}
        self._lock = threading.Lock()  # cache workers read while the caller registers

    @property
    def url(self) -> str:
        return "inplace:"  # no one root: each file is where the caller keeps it

    def put_file(self, path: Path, digest: str) -> None:
        with self._lock:
            self._paths[digest] = path

    def exists(self, digest: str) -> bool:
        with self._lock:
            path = self._paths.get(digest)
        return path is not None and path.is_file()

    def read(self, digest: str) -> Iterator[bytes]:
        with self._lock:
            path = self._paths.get(digest)
        if path is None:
            raise ArtifactNotFoundError(f"no adapter file with sha256 {digest} was given")
        with path.open("rb") as handle:
            chunks = iter(lambda: handle.read(CHUNK_BYTES), b"")
            yield from verified_chunks(chunks, digest, str(path))

    def digests(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._paths))

    def delete(self, digest: str) -> None:
        with self._lock:
            self._paths.pop(digest, None)
