"""The ``mode`` key: refused by name when malformed (engine and serve configs), and a non-default
mode builds the engine's mode controller; without adapters it is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.demo.assets import DemoAssets
from loraplex.engine.config import EngineConfig
from loraplex.engine.factory import build_engine_core
from loraplex.engine.mode_policy import ModeKind
from loraplex.engine.offline import OfflineEngine
from loraplex.serve.config import ServeConfig


@pytest.mark.parametrize("mode", ["fast", "merged", "merged:nope"])
def test_a_malformed_mode_is_refused_naming_it(mode: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"mode '{mode}' is invalid"):
        EngineConfig(mode=mode)
    with pytest.raises(ValueError, match=f"mode '{mode}' is invalid"):
        ServeConfig(data_dir=tmp_path, mode=mode)


def test_auto_builds_a_controller_and_needs_adapters(demo_assets: DemoAssets) -> None:
    model_dir = demo_assets.base_model_dir
    with OfflineEngine(model_dir) as offline:
        assert offline.core.modes is None  # unmerged: nothing runs between steps
        core = build_engine_core(model_dir, EngineConfig(mode="auto"), offline.runtime)
        assert core.modes is not None and core.modes.setting.kind is ModeKind.AUTO
        core.close()
    with pytest.raises(ValueError, match="mode 'auto' is invalid without adapters"):
        build_engine_core(model_dir, EngineConfig(mode="auto"), None)
