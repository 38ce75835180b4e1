"""First-start state for ``loraplex serve``: the demo tenants and adapters, their first API
keys, the admin credential. Idempotent: a restart on the same data directory reuses everything.

Each demo tenant's core adapter (its first in the manifest, the revision its alias serves) is
registered with the ``cpu`` warm policy, as a launch-ready deployment keeps its core adapters
(the launch checklist's item 6): kept in host memory, so its first token never waits for a
fetch. Only at registration: an operator's later change survives restarts.

Torch-free. Tenant keys exist in plain text only when they are issued (``loraplex serve`` prints
them once); the database keeps their hashes. The admin credential is kept in the data directory
(0700), in a file only its owner can read (0600).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.demo.manifest import DemoAdapter, DemoAssets
from loraplex.registry import RegistrationRequest, Registry, Revision
from loraplex.registry.sql.paging import Page
from loraplex.server.admin_key import admin_key_problem

ADMIN_KEY_FILE = "admin-key"
# Where earlier versions kept the demo tenants' keys in plain text; removed at start.
LEGACY_SAMPLE_KEYS_FILE = "sample-keys.json"
ADMIN_KEY_PREFIX = "lpxadmin_"
BOOTSTRAP_ACTOR = "loraplex-serve"
# The warm policy of each demo tenant's core adapter: host memory, not a GPU slot, so it holds
# whatever max_loras is (three gpu pins would take every slot of a small deployment).
CORE_WARM_POLICY = WarmPolicy.CPU


@dataclass(frozen=True)
class DemoState:
    """What the demo bootstrap registered."""

    revisions: tuple[Revision, ...]  # every demo revision, in manifest order
    tenants: tuple[str, ...]  # the demo tenants
    core: tuple[str, ...] = ()  # ``tenant/name@revision`` of each tenant's core adapter


def core_adapters(assets: DemoAssets) -> tuple[DemoAdapter, ...]:
    """Each demo tenant's first revision in manifest order: registered first, so its alias
    serves it."""
    first: dict[str, DemoAdapter] = {}
    for adapter in assets.adapters:
        first.setdefault(adapter.tenant, adapter)
    return tuple(first.values())


def register_demo(registry: Registry, assets: DemoAssets) -> DemoState:
    """Create the demo tenants and register every demo revision with its output probe (each
    tenant's core adapter with ``CORE_WARM_POLICY``)."""
    tenants = tuple(dict.fromkeys(a.tenant for a in assets.adapters))
    existing = {t.name for t in registry.list_tenants()}
    for tenant in tenants:
        if tenant not in existing:
            registry.create_tenant(tenant, BOOTSTRAP_ACTOR)
    core = core_adapters(assets)
    revisions = []
    for adapter in assets.adapters:
        request = RegistrationRequest(
            adapter_dir=adapter.path,
            tenant=adapter.tenant,
            name=adapter.name,
            revision=adapter.revision,
            warm_policy=CORE_WARM_POLICY if adapter in core else WarmPolicy.ON_DEMAND,
            probe_prompt=adapter.probe_prompt,
            expected_continuation=adapter.expected_continuation,
        )
        revisions.append(registry.register(request, BOOTSTRAP_ACTOR).revision)
    return DemoState(tuple(revisions), tenants, tuple(a.ref for a in core))


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    staged.replace(path)


def sample_keys(registry: Registry, tenants: tuple[str, ...], data_dir: Path) -> dict[str, str]:
    """A new API key for each of ``tenants`` that never had one (tenant -> token).

    The tokens are in the result only (shown once, like ``loraplex keys create``): a restart
    finds the keys and issues none. NOTE: a tenant whose keys were all revoked got a new one on
    every start (printed), undoing the operator's revocation; a revoked key stays listed, so such
    a tenant gets none now (``loraplex keys create`` issues one). A plain-text key file that an
    earlier version left in ``data_dir`` is removed; the keys in it stay valid until revoked.
    """
    (data_dir / LEGACY_SAMPLE_KEYS_FILE).unlink(missing_ok=True)
    keys: dict[str, str] = {}
    for tenant in tenants:
        if not registry.list_keys(tenant, Page(limit=1)):  # one is enough: not all of them
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
        problem = admin_key_problem(saved)
        if problem is not None:
            # an operator rotating the key writes this file; the server's own check would name
            # only admin_key, not the file the value came from
            raise ValueError(
                f"{path}: the saved admin key is invalid ({problem}); write a valid one, or "
                "delete the file to have one generated"
            )
        return saved
    key = ADMIN_KEY_PREFIX + secrets.token_urlsafe(32)
    _write_secret(path, key + "\n")
    return key
