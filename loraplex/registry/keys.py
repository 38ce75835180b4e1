"""API key tokens: generation, parsing and hashing.

A token is ``lpx_<key_id>_<secret>``. The key id is public (it is how a key is listed and revoked,
and how the stored row is found without comparing secrets in SQL); the secret is 32 random bytes.
Only ``sha256(token)`` is stored, and it is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

TOKEN_PREFIX = "lpx_"
_KEY_ID_BYTES = 8
_SECRET_BYTES = 32
_TOKEN = re.compile(r"lpx_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")


@dataclass(frozen=True)
class NewToken:
    """A freshly generated token and what is stored about it."""

    key_id: str  # public id (16 hex digits)
    token: str  # the secret bearer token, shown once
    token_sha256: str  # what the registry stores


def generate_token() -> NewToken:
    """A new random token; tenant-agnostic so it reveals nothing about its owner."""
    key_id = secrets.token_hex(_KEY_ID_BYTES)
    token = f"{TOKEN_PREFIX}{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
    return NewToken(key_id=key_id, token=token, token_sha256=hash_token(token))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def key_id_of(token: str) -> str | None:
    """The key id inside a well-formed token; None for anything else."""
    match = _TOKEN.fullmatch(token)
    return match.group(1) if match else None


def token_matches(token: str, stored_sha256: str) -> bool:
    """Constant-time comparison of a presented token against a stored hash."""
    return hmac.compare_digest(hash_token(token), stored_sha256)
