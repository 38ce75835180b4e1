"""The demo asset set as typed objects, and its ``manifest.json`` (torch-free).

The manifest stores paths relative to the asset root, so an asset directory can be moved or
copied and still describes itself; the objects carry absolute paths for convenience.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import AdapterNotFoundError, CorruptArtifactError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class DemoAdapter:
    """One generated adapter revision and the probe that identifies it."""

    tenant: str  # owning tenant
    name: str  # logical adapter name within the tenant
    revision: str  # revision label
    path: Path  # absolute PEFT adapter directory
    probe_prompt: str  # fixed prompt of the logical adapter (shared by its revisions)
    expected_continuation: str  # exact greedy continuation text of this revision
    probe_max_tokens: int  # max_new_tokens that yields expected_continuation (ends at EOS)
    rank: int  # LoraConfig.r (rank_pattern may override per module)
    lora_alpha: int  # LoraConfig.lora_alpha
    use_rslora: bool  # scale alpha/sqrt(r) instead of alpha/r
    target_modules: tuple[str, ...]  # LoraConfig.target_modules
    digest: str  # sha256 of adapter_model.safetensors

    @property
    def ref(self) -> str:
        """``tenant/name@revision``."""
        return f"{self.tenant}/{self.name}@{self.revision}"

    def key(self, base_digest: str) -> AdapterKey:
        """The adapter's immutable identity on the base model with ``base_digest``."""
        return AdapterKey(base_digest, self.tenant, self.name, self.revision, self.digest)


@dataclass(frozen=True)
class DemoAssets:
    """A generated demo set: one base model and many adapter revisions."""

    root: Path  # absolute asset directory
    base_model_dir: Path  # absolute Hugging Face checkpoint directory
    adapters: tuple[DemoAdapter, ...]  # every adapter revision, in generation order
    manifest_path: Path  # absolute path of manifest.json
    preset: str  # preset name ("small" or "large")
    seed: int  # generator seed
    base_model_name: str  # base model directory name (adapters' base_model_name_or_path)
    base_digest: str  # base_model_digest of base_model_dir

    def adapter(self, tenant: str, name: str, revision: str) -> DemoAdapter:
        """The revision ``tenant/name@revision``; AdapterNotFoundError if not generated."""
        for adapter in self.adapters:
            if (adapter.tenant, adapter.name, adapter.revision) == (tenant, name, revision):
                return adapter
        raise AdapterNotFoundError(f"{tenant}/{name}@{revision} is not in {self.manifest_path}")

    def revisions(self, tenant: str, name: str) -> tuple[DemoAdapter, ...]:
        """All revisions of one logical adapter, in generation order."""
        return tuple(a for a in self.adapters if (a.tenant, a.name) == (tenant, name))


def manifest_payload(assets: DemoAssets) -> dict[str, Any]:
    """The JSON object written to manifest.json (relative paths only)."""
    return {
        "format": MANIFEST_FORMAT,
        "preset": assets.preset,
        "seed": assets.seed,
        "base_model": {
            "name": assets.base_model_name,
            "path": assets.base_model_dir.relative_to(assets.root).as_posix(),
            "digest": assets.base_digest,
        },
        "adapters": [_adapter_payload(adapter, assets.root) for adapter in assets.adapters],
    }


def write_manifest(assets: DemoAssets) -> None:
    text = json.dumps(manifest_payload(assets), indent=2, sort_keys=True) + "\n"
    assets.manifest_path.write_text(text, encoding="utf-8")


def read_manifest(root: Path) -> DemoAssets:
    """Parse ``root/manifest.json``; CorruptArtifactError if missing fields or malformed."""
    path = root / MANIFEST_NAME
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        base = payload["base_model"]
        return DemoAssets(
            root=root,
            base_model_dir=root / base["path"],
            adapters=tuple(_parse_adapter(entry, root) for entry in payload["adapters"]),
            manifest_path=path,
            preset=str(payload["preset"]),
            seed=int(payload["seed"]),
            base_model_name=str(base["name"]),
            base_digest=str(base["digest"]),
        )
    except FileNotFoundError as exc:
        raise CorruptArtifactError(f"{path}: no demo manifest; run `loraplex demo-assets`") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptArtifactError(f"{path}: malformed demo manifest ({exc!r})") from exc


def _adapter_payload(adapter: DemoAdapter, root: Path) -> dict[str, Any]:
    return {
        "tenant": adapter.tenant,
        "name": adapter.name,
        "revision": adapter.revision,
        "path": adapter.path.relative_to(root).as_posix(),
        "probe_prompt": adapter.probe_prompt,
        "expected_continuation": adapter.expected_continuation,
        "probe_max_tokens": adapter.probe_max_tokens,
        "rank": adapter.rank,
        "lora_alpha": adapter.lora_alpha,
        "use_rslora": adapter.use_rslora,
        "target_modules": list(adapter.target_modules),
        "digest": adapter.digest,
    }


def _parse_adapter(entry: dict[str, Any], root: Path) -> DemoAdapter:
    return DemoAdapter(
        tenant=str(entry["tenant"]),
        name=str(entry["name"]),
        revision=str(entry["revision"]),
        path=root / entry["path"],
        probe_prompt=str(entry["probe_prompt"]),
        expected_continuation=str(entry["expected_continuation"]),
        probe_max_tokens=int(entry["probe_max_tokens"]),
        rank=int(entry["rank"]),
        lora_alpha=int(entry["lora_alpha"]),
        use_rslora=bool(entry["use_rslora"]),
        target_modules=tuple(str(module) for module in entry["target_modules"]),
        digest=str(entry["digest"]),
    )
