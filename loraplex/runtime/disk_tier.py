"""L2: a directory of verified adapter copies that survives restarts (torch-free).

Layout: ``root/<sha256 of the adapter key>/`` holds ``adapter_config.json``,
``adapter_model.safetensors`` and ``entry.json`` (the key and the config digest); loads stage
into ``root/.quarantine/<random>/`` and enter by one atomic directory rename after validation.
The sidecar is written into the staged directory before the rename, so a directory under its
final name is always complete.

Recovery on start (``recover``) trusts nothing but the bytes: the sidecar only says which key a
directory claims to be; every surviving copy is re-verified like a fresh download (weights
digest equals the key's, config digest equals the sidecar's, manifest and tensor validation
against the serving base model and rank limit). Quarantine leftovers and anything that fails
are deleted (with a log line), never served. Re-hashing costs one read of L2 at start; a
sidecar-only check would be faster, but would serve a file corrupted on disk while the worker was
down. Hostile files cost little here: the header and config caps refuse them after a few bytes.

The sidecar and the config are both on disk, so together they prove nothing: before a copy is
read (``differs_from_record``) its config and weights are hashed against the registry's record of
the revision, which the pipeline passes in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import RUNTIME_COMPAT_VERSION, AdapterKey, sha256_file
from loraplex.artifacts.validate import ValidatedAdapter, validate_adapter_dir
from loraplex.errors import CorruptArtifactError, DigestMismatchError, LoraplexError
from loraplex.residency.pipeline import RecoveredCopy

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
SIDECAR_FILE = "entry.json"
_QUARANTINE = ".quarantine"
# A sidecar is a few hundred bytes of JSON; a larger one is not read.
_MAX_SIDECAR_BYTES = 4096
_log = logging.getLogger(__name__)


class DiskTier:
    """L2: verified adapter directories under ``root``, named by a digest of the adapter key."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Staged directories of loads that were running when the process stopped are garbage.
        shutil.rmtree(root / _QUARANTINE, ignore_errors=True)
        (root / _QUARANTINE).mkdir(parents=True)
        self._validated: dict[AdapterKey, ValidatedAdapter] = {}
        self._lock = threading.Lock()

    def path_for(self, key: AdapterKey) -> Path:
        return self.root / hashlib.sha256(str(key).encode()).hexdigest()

    def quarantine_dir(self) -> Path:
        path = self.root / _QUARANTINE / secrets.token_hex(8)
        path.mkdir()
        return path

    def commit(self, key: AdapterKey, staged: Path, validated: ValidatedAdapter) -> None:
        config_digest = sha256_file(staged / CONFIG_FILE)
        (staged / SIDECAR_FILE).write_text(_sidecar(key, config_digest), encoding="utf-8")
        final = self.path_for(key)
        staged.rename(final)  # atomic within one filesystem; never a half-written directory
        with self._lock:
            self._validated[key] = replace(validated, path=final)

    def validated(self, key: AdapterKey) -> ValidatedAdapter:
        with self._lock:
            return self._validated[key]

    def remove(self, key: AdapterKey) -> None:
        with self._lock:
            self._validated.pop(key, None)
        shutil.rmtree(self.path_for(key), ignore_errors=True)

    def differs_from_record(self, key: AdapterKey, config_digest: str) -> str | None:
        """Why the copy of ``key`` is not the revision the registry recorded (config sha256
        ``config_digest``, weights sha256 ``key.adapter_digest``), or None when it is."""
        path = self.path_for(key)
        try:
            actual = {name: sha256_file(path / name) for name in (CONFIG_FILE, WEIGHTS_FILE)}
        except OSError as exc:
            return f"is unreadable ({exc.strerror or exc})"
        expected = {CONFIG_FILE: config_digest, WEIGHTS_FILE: key.adapter_digest}
        for name, digest in expected.items():
            if actual[name] != digest:
                return f"has {name} sha256 {actual[name]}; the registry recorded {digest}"
        return None

    def files(self) -> list[Path]:
        """Every file under the tier, quarantine included (tests: nothing leaks)."""
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def recover(self, base: BaseModelSpec, max_lora_rank: int) -> list[RecoveredCopy]:
        """Re-verifies every copy a previous process left and deletes the rest; the survivors,
        which the cache then adopts into its L2 ledger (within budget)."""
        survivors = []
        now = time.time()
        for path in sorted(self.root.iterdir()):
            if path.name == _QUARANTINE:
                continue
            copy = self._verify(path, base, max_lora_rank, now)
            if copy is None:
                _delete(path)
            else:
                survivors.append(copy)
        return survivors

    def _verify(
        self, path: Path, base: BaseModelSpec, max_lora_rank: int, now: float
    ) -> RecoveredCopy | None:
        try:
            key, validated = _check_copy(path, self.path_for, base, max_lora_rank)
        except (LoraplexError, OSError, ValueError, KeyError, TypeError) as exc:
            _log.warning("adapter disk cache: dropping %s: %.300s", path.name, exc)
            return None
        with self._lock:
            self._validated[key] = validated
        size = (path / CONFIG_FILE).stat().st_size + (path / WEIGHTS_FILE).stat().st_size
        age_s = max(0.0, now - (path / SIDECAR_FILE).stat().st_mtime)
        return RecoveredCopy(key, size, age_s)


def _check_copy(
    path: Path, path_for: Callable[[AdapterKey], Path], base: BaseModelSpec, max_lora_rank: int
) -> tuple[AdapterKey, ValidatedAdapter]:
    """The key ``path`` holds and its validation; raises on anything that is not a complete,
    current copy. Cheap checks first, so a stale or tampered copy is never hashed in full."""
    if not path.is_dir() or path.is_symlink():
        raise CorruptArtifactError(f"{path}: not a cache directory")
    key, config_digest = _read_sidecar(path / SIDECAR_FILE)
    if key.compat_version != RUNTIME_COMPAT_VERSION or key.base_digest != base.digest:
        raise CorruptArtifactError(f"{key.ref}: cached for another base model or runtime version")
    if path != path_for(key):
        raise CorruptArtifactError(f"{path}: the sidecar names {key.ref}, stored elsewhere")
    actual = sha256_file(path / CONFIG_FILE)
    if actual != config_digest:
        raise DigestMismatchError(f"{key.ref} {CONFIG_FILE}", config_digest, actual)
    validated = validate_adapter_dir(path, base, max_lora_rank)
    if validated.digest != key.adapter_digest:
        raise DigestMismatchError(f"{key.ref} {WEIGHTS_FILE}", key.adapter_digest, validated.digest)
    return key, validated


def _sidecar(key: AdapterKey, config_digest: str) -> str:
    fields = {
        "base_digest": key.base_digest,
        "tenant": key.tenant,
        "name": key.name,
        "revision": key.revision,
        "adapter_digest": key.adapter_digest,
        "compat_version": key.compat_version,
        "config_digest": config_digest,
    }
    return json.dumps(fields, sort_keys=True)


def _read_sidecar(path: Path) -> tuple[AdapterKey, str]:
    with path.open("rb") as handle:
        raw = handle.read(_MAX_SIDECAR_BYTES + 1)
    if len(raw) > _MAX_SIDECAR_BYTES:
        raise CorruptArtifactError(f"{path}: over {_MAX_SIDECAR_BYTES} bytes; not a sidecar")
    fields = json.loads(raw.decode("utf-8"))
    key = AdapterKey(
        str(fields["base_digest"]),
        str(fields["tenant"]),
        str(fields["name"]),
        str(fields["revision"]),
        str(fields["adapter_digest"]),
        int(fields["compat_version"]),
    )
    return key, str(fields["config_digest"])


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
