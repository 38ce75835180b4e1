"""Tenant and adapter names as traces export them: as they are only when the operator allows
it, otherwise keyed hashes (HMAC-SHA256 with the server's secret), so a trace backend readable
by many cannot tell whose adapters exist, yet one name always hashes the same (torch-free)."""

from __future__ import annotations

import hashlib
import hmac

HASH_PREFIX = "h:"
HASH_HEX_CHARS = 24  # 96 bits: no collisions among any realistic number of names


class NameMasker:
    """Maps a private name to what a span may carry."""

    def __init__(self, secret: bytes, export_names: bool) -> None:
        self._secret = secret
        self._export_names = export_names

    def __call__(self, name: str) -> str:
        if self._export_names:
            return name
        digest = hmac.new(self._secret, name.encode("utf-8"), hashlib.sha256).hexdigest()
        return HASH_PREFIX + digest[:HASH_HEX_CHARS]
