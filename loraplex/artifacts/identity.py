"""Adapter identity: the immutable key every cache is indexed by, and content digests."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from loraplex.errors import quoted

# Bumped whenever loraplex would execute the same adapter bytes differently (scaling rules,
# supported features), so caches filled by an older runtime are never reused.
RUNTIME_COMPAT_VERSION = 1

_CHUNK_BYTES = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_NAME_CHARS = 128  # the longest tenant, adapter or revision name
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed in 1 MiB chunks (never the whole file in memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def is_name(value: str) -> bool:
    """Whether ``value`` may name a tenant, adapter or revision (``check_name``)."""
    return _NAME.fullmatch(value) is not None


def check_name(field: str, value: str) -> str:
    """Tenant, adapter and revision names: 1-128 of ``[A-Za-z0-9._-]``, not starting with a dot."""
    if not is_name(value):
        raise ValueError(
            f"{field} {quoted(value)} is invalid; expected 1-128 characters of [A-Za-z0-9._-] "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True, order=True)
class AdapterKey:
    """The identity of one immutable adapter revision as served on one base model.

    Equal keys mean identical behaviour: same base weights, same adapter bytes, same runtime
    semantics. Names alone never identify an adapter (a name can be re-pointed; a key cannot).
    """

    base_digest: str  # sha256 over the base checkpoint's config and weight files
    tenant: str  # owning tenant
    name: str  # adapter name within the tenant
    revision: str  # immutable revision label
    adapter_digest: str  # sha256 of adapter_model.safetensors
    compat_version: int = RUNTIME_COMPAT_VERSION  # runtime semantics version

    def __post_init__(self) -> None:
        for field in ("base_digest", "adapter_digest"):
            value = getattr(self, field)
            if not _HEX64.fullmatch(value):
                raise ValueError(f"{field} {value!r} is invalid; expected 64 lowercase hex digits")
        check_name("tenant", self.tenant)
        check_name("name", self.name)
        check_name("revision", self.revision)
        if self.compat_version < 1:
            raise ValueError(f"compat_version {self.compat_version} is invalid; expected >= 1")
        # every cache and ledger looks keys up (about 65 hashes per L1 -> L0 load): hashed once
        object.__setattr__(self, "_hash", hash(self._fields()))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    def __reduce__(self) -> tuple[type[AdapterKey], tuple[str, str, str, str, str, int]]:
        # rebuilt through __init__: a string's hash differs between processes
        return (AdapterKey, self._fields())

    def _fields(self) -> tuple[str, str, str, str, str, int]:
        return (
            self.base_digest,
            self.tenant,
            self.name,
            self.revision,
            self.adapter_digest,
            self.compat_version,
        )

    @property
    def ref(self) -> str:
        """The tenant-visible reference ``tenant/name@revision``."""
        return f"{self.tenant}/{self.name}@{self.revision}"

    def __str__(self) -> str:
        return (
            f"{self.tenant}/{self.name}@{self.revision}"
            f"#{self.adapter_digest}~{self.base_digest}~v{self.compat_version}"
        )
