"""Registering many adapters in one process: a directory tree or a JSONL manifest.

One process and one registry connection for the whole batch; each item is still registered the
way ``Registry.register`` registers one (validated, objects stored, rows in one transaction), so
a bad item is reported with its error and changes nothing, the others are registered, and a
re-run is a no-op for what is already there (identical bytes).

Sources:

- a tree ``ROOT/<tenant>/<name>/<revision>/`` whose leaves hold ``adapter_config.json`` and
  ``adapter_model.safetensors`` (the demo assets' layout);
- a manifest: one JSON object per line with ``tenant``, ``name``, ``revision`` and ``path``
  (relative to the manifest's folder, or absolute), optionally ``state``, ``warm_policy``,
  ``probe_prompt``, ``expected_continuation`` and ``public``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.errors import LoraplexError, did_you_mean
from loraplex.registry.models import (
    RegistrationRequest,
    RegistrationResult,
    RevisionState,
    Visibility,
)
from loraplex.registry.registry import Registry

# Depth of an adapter folder below a tree's root: tenant / name / revision.
_TREE_DEPTH = 3
# The keys of a manifest line (every other key is refused, naming it).
MANIFEST_KEYS = (
    *("tenant", "name", "revision", "path", "state", "warm_policy"),
    *("probe_prompt", "expected_continuation", "public"),
)
# Errors that make one item fail; anything else (a bug, a lost database) stops the batch.
ITEM_ERRORS = (LoraplexError, ValueError, OSError)


@dataclass(frozen=True)
class BulkItem:
    """One adapter to register, or why its description is unusable."""

    source: str  # where it came from: the folder, or manifest:line
    request: RegistrationRequest | None  # None when the description itself was bad
    error: str | None = None  # why the description was bad (request None)


@dataclass(frozen=True)
class BulkFailure:
    """An item that was not registered."""

    source: str  # the folder, or manifest:line
    error: str  # the error, as the single-item command would print it


@dataclass
class BulkReport:
    """What one bulk registration did."""

    created: list[RegistrationResult] = field(default_factory=list)  # newly registered
    unchanged: list[RegistrationResult] = field(default_factory=list)  # identical bytes, no-op
    failed: list[BulkFailure] = field(default_factory=list)  # not registered, with why


def register_all(registry: Registry, items: Iterable[BulkItem], actor: str) -> BulkReport:
    """Registers every item in order; a failing item is recorded and the rest go on."""
    report = BulkReport()
    for item in items:
        if item.request is None:
            report.failed.append(BulkFailure(item.source, item.error or "unusable item"))
            continue
        try:
            result = registry.register(item.request, actor)
        except ITEM_ERRORS as exc:
            report.failed.append(BulkFailure(item.source, str(exc)))
            continue
        (report.created if result.created else report.unchanged).append(result)
    return report


def tree_items(
    root: Path,
    *,
    state: RevisionState = RevisionState.STABLE,
    warm_policy: WarmPolicy = WarmPolicy.ON_DEMAND,
    visibility: Visibility = Visibility.PRIVATE,
) -> Iterator[BulkItem]:
    """Every adapter folder under ``root`` (sorted); one at the wrong depth is an error item."""
    if not root.is_dir():
        raise ValueError(f"root {root} is invalid; expected a directory")
    for config in sorted(root.rglob(CONFIG_FILE)):
        folder = config.parent
        parts = folder.relative_to(root).parts
        if len(parts) != _TREE_DEPTH:
            error = f"{folder} is invalid; expected ROOT/<tenant>/<name>/<revision>/"
            yield BulkItem(str(folder), None, error)
            continue
        tenant, name, revision = parts
        try:
            request = RegistrationRequest(
                folder, tenant, name, revision, state, warm_policy, visibility=visibility
            )
        except ValueError as exc:
            yield BulkItem(str(folder), None, str(exc))
            continue
        yield BulkItem(str(folder), request)


def manifest_items(manifest: Path) -> Iterator[BulkItem]:
    """One item per non-blank line of the JSONL ``manifest``."""
    with manifest.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            source = f"{manifest}:{number}"
            try:
                request = _manifest_request(json.loads(line), manifest.parent)
            except (ValueError, KeyError, TypeError) as exc:
                yield BulkItem(source, None, f"{type(exc).__name__}: {exc}")
                continue
            yield BulkItem(source, request)


def _manifest_request(fields: Any, folder: Path) -> RegistrationRequest:
    if not isinstance(fields, dict):
        raise TypeError(f"line is a {type(fields).__name__}; expected a JSON object")
    # NOTE: an unknown key was read by nothing: a misspelt ``"warm_polcy": "gpu"`` registered
    # the revision on_demand, with nothing said
    unknown = sorted(set(fields) - set(MANIFEST_KEYS))
    if unknown:
        hint = did_you_mean(unknown, MANIFEST_KEYS)
        raise ValueError(
            f"keys {unknown} are unknown{hint}; expected some of {list(MANIFEST_KEYS)}"
        )
    path = Path(str(fields["path"]))
    public = fields.get("public", False)
    if not isinstance(public, bool):
        raise TypeError(f"public {public!r} is invalid; expected true or false")
    return RegistrationRequest(
        adapter_dir=path if path.is_absolute() else folder / path,
        tenant=str(fields["tenant"]),
        name=str(fields["name"]),
        revision=str(fields["revision"]),
        state=RevisionState(fields.get("state", RevisionState.STABLE.value)),
        warm_policy=WarmPolicy(fields.get("warm_policy", WarmPolicy.ON_DEMAND.value)),
        probe_prompt=fields.get("probe_prompt"),
        expected_continuation=fields.get("expected_continuation"),
        visibility=Visibility.PUBLIC if public else Visibility.PRIVATE,
    )
