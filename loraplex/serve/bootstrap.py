"""First-start state for ``loraplex serve``: the demo tenants and adapters, their first API
keys, the admin credential. Idempotent: a restart on the same data directory reuses everything.

Torch-free. Tenant keys exist in plain text only when they are issued (``loraplex serve`` prints
them once); the database keeps their hashes. The admin credential is kept in the data directory
(0700), in a file only its owner can read (0600).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from loraplex.demo.manifest import DemoAssets
from loraplex.registry import RegistrationRequest, Registry, Revision

ADMIN_KEY_FILE = "admin-key"
# Where earlier versions kept the demo tenants' keys in plain text; removed at start.
LEGACY_SAMPLE_KEYS_FILE = "sample-keys.json"
ADMIN_KEY_PREFIX = "lpxadmin_"
BOOTSTRAP_ACTOR = "loraplex-serve"


@dataclass(frozen=True)
class DemoState:
    """What the demo bootstrap registered."""

    revisions: tuple[Revision, ...]  # every demo revision, in manifest order
    tenants: tuple[str, ...]  # the demo tenants


def register_demo(registry: Registry, assets: DemoAssets) -> DemoState:
    """Create the demo tenants and register every demo revision with its output probe."""
    tenants = tuple(dict.fromkeys(a.tenant for a in assets.adapters))
    existing = {t.name for t in registry.list_tenants()}
    for tenant in tenants:
        if tenant not in existing:
            registry.create_tenant(tenant, BOOTSTRAP_ACTOR)
    revisions = []
    for adapter in assets.adapters:
        request = RegistrationRequest(
            adapter_dir=adapter.path,
            tenant=adapter.tenant,
            name=adapter.name,
            revision=adapter.revision,
            probe_prompt=adapter.probe_prompt,
            expected_continuation=adapter.expected_continuation,
        )
        revisions.append(registry.register(request, BOOTSTRAP_ACTOR).revision)
    return DemoState(tuple(revisions), tenants)


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    staged.replace(path)


def sample_keys(registry: Registry, tenants: tuple[str, ...], data_dir: Path) -> dict[str, str]:
    """A new API key for each of ``tenants`` that has no active one (tenant -> token).

    The tokens are in the result only (shown once, like ``loraplex keys create``): a restart
    finds the keys active and issues none. A plain-text key file that an earlier version left in
    ``data_dir`` is removed; the keys in it stay valid until revoked.
    """
    (data_dir / LEGACY_SAMPLE_KEYS_FILE).unlink(missing_ok=True)
    keys: dict[str, str] = {}
    for tenant in tenants:
        if not any(key.revoked_at is None for key in registry.list_keys(tenant)):
            keys[tenant] = registry.create_key(tenant, BOOTSTRAP_ACTOR).token
    return keys


def admin_key(data_dir: Path) -> str:
    """The saved admin credential of this data directory, generated on first use."""
    path = data_dir / ADMIN_KEY_FILE
    try:
        saved = path.read_text(encoding="utf-8").strip()
    except OSError:
        saved = ""
    if saved:
        return saved
    key = ADMIN_KEY_PREFIX + secrets.token_urlsafe(32)
    _write_secret(path, key + "\n")
    return key
