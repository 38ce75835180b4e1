"""``loraplex.fleet.app``: the Serve application builder's arguments (RayService, serve run)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from loraplex.demo.assets import DemoAssets
from loraplex.fleet.app import settings_from_args


def test_args_and_environment_make_the_settings(demo_assets: DemoAssets, tmp_path: Path) -> None:
    args = {
        "replicas": 3, "policy": "pow2", "max_loras": 2, "model": str(demo_assets.base_model_dir),
        "demo": False,
    }  # fmt: skip
    env = {"LORAPLEX_DATA_DIR": str(tmp_path), "LORAPLEX_ADMIN_KEY": "a" * 40}
    settings = settings_from_args(args, env)
    assert settings.engine_replicas == 3 and settings.policy == "pow2"
    assert settings.serve.max_loras == 2 and settings.serve.data_dir == tmp_path
    assert settings.serve.admin_key == "a" * 40
    assert settings.model_dir == demo_assets.base_model_dir
    assert (tmp_path / "registry.db").exists() or any(tmp_path.iterdir())  # prepared


def test_an_unknown_arg_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_lora_slots"):
        settings_from_args({"max_lora_slots": 4}, {"LORAPLEX_DATA_DIR": str(tmp_path)})


def test_a_serve_key_the_fleet_cannot_honour_is_refused(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    args = {"model": str(demo_assets.base_model_dir), "admin_port": 9000, "demo": False}
    with pytest.raises(ValueError, match="admin_port"):
        settings_from_args(args, {"LORAPLEX_DATA_DIR": str(tmp_path)})
