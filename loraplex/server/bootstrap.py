"""First-start state for ``loraplex serve``: the demo tenants and adapters, sample keys, the
admin credential. Idempotent: a restart on the same data directory reuses everything.

Torch-free. Secrets live in files of the data directory readable by the owner only (0600); a
saved tenant key that no longer authenticates (revoked) is replaced.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from loraplex.demo.manifest import DemoAssets
from loraplex.errors import AuthenticationError
from loraplex.registry import RegistrationRequest, Registry, Revision

ADMIN_KEY_FILE = "admin-key"
SAMPLE_KEYS_FILE = "sample-keys.json"
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
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    staged.replace(path)


def sample_keys(registry: Registry, tenants: tuple[str, ...], data_dir: Path) -> dict[str, str]:
    """One working API key per tenant (tenant -> token), reused across restarts."""
    path = data_dir / SAMPLE_KEYS_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    keys: dict[str, str] = {}
    for tenant in tenants:
        token = saved.get(tenant) if isinstance(saved, dict) else None
        if isinstance(token, str) and _authenticates(registry, token, tenant):
            keys[tenant] = token
        else:
            keys[tenant] = registry.create_key(tenant, BOOTSTRAP_ACTOR).token
    if keys != saved:
        _write_secret(path, json.dumps(keys, indent=2, sort_keys=True) + "\n")
    return keys


def _authenticates(registry: Registry, token: str, tenant: str) -> bool:
    try:
        return registry.authenticate(token).name == tenant
    except AuthenticationError:
        return False


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
