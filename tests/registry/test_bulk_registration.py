"""Bulk registration: a tree or a manifest in one process; bad items reported, the rest kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from registry_kit import AdapterFactory
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.errors import AdapterNotFoundError
from loraplex.registry import Registry, RegistryConfig
from loraplex.registry.bulk import manifest_items, register_all, tree_items

NUM_GOOD = 20


def _tree(make_adapter: AdapterFactory, tmp_path: Path) -> tuple[Path, Path]:
    """``NUM_GOOD`` valid adapters and one with a truncated weights file; (root, broken)."""
    for i in range(NUM_GOOD):
        make_adapter(f"acme/bot{i:02d}/v1", seed=i)
    broken = make_adapter("acme/broken/v1", seed=99)
    weights = broken / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    return tmp_path / "adapters", broken


def _registered(registry: Registry) -> list[str]:
    return [e.subject for e in registry.audit_log() if e.action == "revision.register"]


def test_tree_registers_every_good_adapter_and_reports_the_corrupt_one(
    registry: Registry, make_adapter: AdapterFactory, tmp_path: Path
) -> None:
    registry.create_tenant("acme", "ops")
    root, broken = _tree(make_adapter, tmp_path)

    report = register_all(registry, tree_items(root), "ops")

    assert sorted(r.revision.ref for r in report.created) == [
        f"acme/bot{i:02d}@v1" for i in range(NUM_GOOD)
    ]
    assert [f.source for f in report.failed] == [str(broken)]
    assert report.failed[0].error
    with pytest.raises(AdapterNotFoundError):
        registry.get_revision("acme/broken@v1")
    assert len(_registered(registry)) == NUM_GOOD
    assert registry.check_integrity() == []

    again = register_all(registry, tree_items(root), "ops")
    assert (len(again.created), len(again.unchanged)) == (0, NUM_GOOD)
    assert [f.source for f in again.failed] == [str(broken)]
    assert len(_registered(registry)) == NUM_GOOD


def test_tree_refuses_a_folder_at_the_wrong_depth(
    registry: Registry, make_adapter: AdapterFactory, tmp_path: Path
) -> None:
    registry.create_tenant("acme", "ops")
    make_adapter("acme/bot/v1")
    shallow = make_adapter("acme/flat", seed=1)
    report = register_all(registry, tree_items(tmp_path / "adapters"), "ops")
    assert [r.revision.ref for r in report.created] == ["acme/bot@v1"]
    assert [f.source for f in report.failed] == [str(shallow)]
    assert "tenant" in report.failed[0].error


def test_manifest_reports_bad_lines_by_number(
    registry: Registry, make_adapter: AdapterFactory, tmp_path: Path
) -> None:
    registry.create_tenant("acme", "ops")
    make_adapter("one", seed=1)
    absolute = make_adapter("two", seed=2)
    manifest = tmp_path / "adapters" / "batch.jsonl"
    lines = [
        {"tenant": "acme", "name": "one", "revision": "v1", "path": "one", "public": True},
        "not json",
        {
            "tenant": "acme",
            "name": "two",
            "revision": "v1",
            "path": str(absolute),
            "warm_policy": "cpu",
        },
        {"tenant": "acme", "name": "three", "revision": "v1"},
        {"tenant": "nobody", "name": "four", "revision": "v1", "path": "one"},
    ]
    manifest.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n\n"
    )

    report = register_all(registry, manifest_items(manifest), "ops")

    assert [r.revision.ref for r in report.created] == ["acme/one@v1", "acme/two@v1"]
    assert registry.get_adapter("acme", "one").visibility.value == "public"
    assert registry.get_revision("acme/two@v1").warm_policy.value == "cpu"
    assert [f.source for f in report.failed] == [f"{manifest}:{n}" for n in (2, 4, 5)]
    assert "does not exist" in report.failed[2].error


def test_manifest_refuses_a_line_with_an_unknown_key(
    registry: Registry, make_adapter: AdapterFactory, tmp_path: Path
) -> None:
    """A misspelt key was read by nothing: the revision registered without what it said."""
    registry.create_tenant("acme", "ops")
    make_adapter("one", seed=1)
    manifest = tmp_path / "adapters" / "batch.jsonl"
    line = {"tenant": "acme", "name": "one", "revision": "v1", "path": "one", "warm_polcy": "gpu"}
    manifest.write_text(json.dumps(line) + "\n")

    report = register_all(registry, manifest_items(manifest), "ops")

    assert report.created == [] and [f.source for f in report.failed] == [f"{manifest}:1"]
    assert "['warm_polcy'] are unknown (warm_polcy: did you mean warm_policy?)" in (
        report.failed[0].error
    )
    assert _registered(registry) == []


def test_cli_register_many_exits_non_zero_when_an_item_failed(
    registry_config: RegistryConfig,
    registry: Registry,
    model_dir: Path,
    make_adapter: AdapterFactory,
    tmp_path: Path,
) -> None:
    registry.create_tenant("acme", "ops")
    root, broken = _tree(make_adapter, tmp_path)
    env = {
        "LORAPLEX_DATA_DIR": str(registry_config.data_dir),
        "LORAPLEX_DATABASE_URL": registry_config.database,
        "LORAPLEX_BASE_MODEL": str(model_dir),
    }
    result = CliRunner().invoke(app, ["adapters", "register-many", str(root)], env=env)
    assert result.exit_code == 1, result.output
    assert f"failed {broken}: " in result.output
    assert f"{NUM_GOOD} registered, 0 already registered, 1 failed" in result.output
    assert len(_registered(registry)) == NUM_GOOD


def test_cli_register_many_on_a_missing_source_is_one_error_line(
    registry_config: RegistryConfig, model_dir: Path, tmp_path: Path
) -> None:
    env = {
        "LORAPLEX_DATA_DIR": str(registry_config.data_dir),
        "LORAPLEX_DATABASE_URL": registry_config.database,
        "LORAPLEX_BASE_MODEL": str(model_dir),
    }
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(app, ["adapters", "register-many", str(missing)], env=env)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert f"error: {missing} does not exist" in result.output
