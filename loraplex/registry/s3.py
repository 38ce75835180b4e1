"""S3-compatible object storage as an ``ArtifactStore`` (AWS S3, MinIO, Ceph RGW, moto).

Credentials come from boto3's usual chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
profiles, instance roles); only the endpoint, bucket and prefix are configured here. Objects live
at ``<prefix>sha256/<digest>``. A PUT is atomic in S3 (an object is visible whole or not at all);
after it, the object is read back and hashed, so a store that silently altered bytes is caught
at registration rather than at serving time.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loraplex.artifacts.identity import sha256_file
from loraplex.artifacts.store import CHUNK_BYTES, check_digest, verified_chunks
from loraplex.errors import ArtifactNotFoundError, DigestMismatchError

_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


class S3ArtifactStore:
    """Content-addressed objects in one bucket under one key prefix."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        client: Any = None,
    ) -> None:
        if not bucket:
            raise ValueError("bucket '' is invalid; expected a bucket name")
        self._bucket = bucket
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._client = client if client is not None else _make_client(endpoint_url)

    @property
    def url(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}"

    def object_key(self, digest: str) -> str:
        return f"{self._prefix}sha256/{check_digest(digest)}"

    def put_file(self, path: Path, digest: str) -> None:
        key = self.object_key(digest)
        actual = sha256_file(path)
        if actual != digest:
            raise DigestMismatchError(str(path), digest, actual)
        if self._verify_remote(key, digest):
            return
        checksum = base64.b64encode(bytes.fromhex(digest)).decode("ascii")
        with path.open("rb") as body:
            self._client.put_object(
                Bucket=self._bucket, Key=key, Body=body, ChecksumSHA256=checksum
            )
        if not self._verify_remote(key, digest):
            self._client.delete_object(Bucket=self._bucket, Key=key)
            raise DigestMismatchError(f"{self.url}sha256/{digest} after upload", digest, "other")

    def exists(self, digest: str) -> bool:
        try:
            self._client.head_object(Bucket=self._bucket, Key=self.object_key(digest))
        except Exception as exc:
            if _is_missing(exc):
                return False
            raise
        return True

    def read(self, digest: str) -> Iterator[bytes]:
        key = self.object_key(digest)
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=key)
        except Exception as exc:
            if _is_missing(exc):
                raise ArtifactNotFoundError(
                    f"artifact store {self.url} has no object {digest}"
                ) from exc
            raise
        body = response["Body"]
        try:
            yield from verified_chunks(body.iter_chunks(CHUNK_BYTES), digest, f"s3://{key}")
        finally:
            body.close()

    def digests(self) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        start = f"{self._prefix}sha256/"
        for page in paginator.paginate(Bucket=self._bucket, Prefix=start):
            for entry in page.get("Contents", []):
                yield str(entry["Key"])[len(start) :]

    def delete(self, digest: str) -> None:
        self._client.delete_object(Bucket=self._bucket, Key=self.object_key(digest))

    def _verify_remote(self, key: str, digest: str) -> bool:
        """Whether the stored object exists and hashes to ``digest`` (streamed read-back)."""
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=key)
        except Exception as exc:
            if _is_missing(exc):
                return False
            raise
        hasher = hashlib.sha256()
        body = response["Body"]
        try:
            for chunk in body.iter_chunks(CHUNK_BYTES):
                hasher.update(chunk)
        finally:
            body.close()
        return hasher.hexdigest() == digest


def _make_client(endpoint_url: str | None) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url)


def _is_missing(exc: Exception) -> bool:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    return str(response.get("Error", {}).get("Code")) in _MISSING_CODES
