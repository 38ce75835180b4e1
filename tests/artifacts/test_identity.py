"""AdapterKey: the immutable identity every cache is keyed by; content digests."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.artifacts.identity import RUNTIME_COMPAT_VERSION, AdapterKey, check_name, sha256_file

BASE = "0f" * 32
DIGEST = "a1" * 32


def key(**overrides: object) -> AdapterKey:
    fields: dict[str, object] = {
        "base_digest": BASE,
        "tenant": "acme",
        "name": "support-bot",
        "revision": "2024-06-01.v3",
        "adapter_digest": DIGEST,
    }
    fields.update(overrides)
    return AdapterKey(**fields)  # type: ignore[arg-type]


def test_str_names_every_field_and_ref() -> None:
    original = key(compat_version=3)
    assert str(original) == f"acme/support-bot@2024-06-01.v3#{DIGEST}~{BASE}~v3"
    assert original.ref == "acme/support-bot@2024-06-01.v3"
    assert key().compat_version == RUNTIME_COMPAT_VERSION


def test_equality_and_hash_cover_every_field() -> None:
    assert key() == key() and hash(key()) == hash(key())
    variants = [
        key(base_digest="1f" * 32),
        key(tenant="other"),
        key(name="other"),
        key(revision="r2"),
        key(adapter_digest="b2" * 32),
        key(compat_version=RUNTIME_COMPAT_VERSION + 1),
    ]
    assert len({key(), *variants}) == 1 + len(variants)
    assert all(variant != key() for variant in variants)


def test_a_key_from_another_process_hashes_as_this_ones() -> None:
    """The hash is kept per key, and strings hash differently in every process: a pickled key
    (the engine process's transport) is rebuilt with this process's hash, or no dict finds it."""
    code = (
        "import pickle, sys\n"
        "from loraplex.artifacts.identity import AdapterKey\n"
        f"key = AdapterKey({BASE!r}, 'acme', 'support-bot', '2024-06-01.v3', {DIGEST!r})\n"
        "sys.stdout.buffer.write(pickle.dumps(key))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    blob = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, check=True
    ).stdout
    theirs = pickle.loads(blob)
    assert theirs == key() and hash(theirs) == hash(key())
    assert {key(): "found"}[theirs] == "found"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("base_digest", "xyz", "base_digest 'xyz' is invalid; expected 64 lowercase hex"),
        ("adapter_digest", "A1" * 32, "adapter_digest"),
        ("tenant", "", "tenant '' is invalid"),
        ("tenant", "a/b", "tenant 'a/b' is invalid"),
        ("name", ".hidden", "name '.hidden' is invalid"),
        ("revision", "r@1", "revision 'r@1' is invalid"),
        ("revision", "r" * 129, "1-128 characters"),
        ("compat_version", 0, "compat_version 0 is invalid"),
    ],
)
def test_invalid_fields_raise_value_error(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        key(**{field: value})


def test_check_name_returns_valid_names() -> None:
    assert check_name("tenant", "Team_1.prod-x") == "Team_1.prod-x"


def test_sha256_file_matches_hashlib_across_chunks(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    payload = bytes(range(256)) * 9000  # > one 1 MiB chunk
    path.write_bytes(payload)
    assert sha256_file(path) == hashlib.sha256(payload).hexdigest()
    path.write_bytes(b"")
    assert sha256_file(path) == hashlib.sha256(b"").hexdigest()
