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
are deleted, never served. Re-hashing costs one read of L2 at start; a sidecar-only check would
be faster, but would serve a file corrupted on disk while the worker was down.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

from loraplex.adapters.base_model import BaseModelSpec
from loraplex.adapters.identity import RUNTIME_COMPAT_VERSION, AdapterKey, sha256_file
from loraplex.adapters.pipeline import RecoveredCopy
from loraplex.adapters.validate import ValidatedAdapter, validate_adapter_dir
from loraplex.errors import LoraplexError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
SIDECAR_FILE = "entry.json"
_QUARANTINE = ".quarantine"


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
        if not path.is_dir() or path.is_symlink():
            return None
        try:
            key, config_digest = _read_sidecar(path / SIDECAR_FILE)
            stale = key.compat_version != RUNTIME_COMPAT_VERSION or key.base_digest != base.digest
            if stale or path != self.path_for(key):
                return None
            if sha256_file(path / CONFIG_FILE) != config_digest:
                return None
            validated = validate_adapter_dir(path, base, max_lora_rank)
        except (LoraplexError, OSError, ValueError, KeyError, TypeError):
            return None
        if validated.digest != key.adapter_digest:
            return None
        with self._lock:
            self._validated[key] = validated
        size = (path / CONFIG_FILE).stat().st_size + (path / WEIGHTS_FILE).stat().st_size
        age_s = max(0.0, now - (path / SIDECAR_FILE).stat().st_mtime)
        return RecoveredCopy(key, size, age_s)


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
    fields = json.loads(path.read_text(encoding="utf-8"))
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
