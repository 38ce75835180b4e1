"""The checkpoint loaded on a thread beside the engine's start (``engine/model_load.py``): the
same model as a load in place, and the load's error raised where its result is asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from loraplex.engine.config import EngineConfig
from loraplex.engine.model_load import load_in_background
from loraplex.errors import CheckpointError
from loraplex.model.checkpoint import load_checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    from loraplex.demo.assets import DemoAssets


def test_the_background_model_equals_one_loaded_in_place(demo_assets: DemoAssets) -> None:
    model_dir = demo_assets.base_model_dir
    loaded = load_in_background(model_dir, EngineConfig()).result()
    expected = dict(load_checkpoint(model_dir).named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, expected[name]), name


def test_a_bad_device_is_raised_by_model(demo_assets: DemoAssets) -> None:
    loading = load_in_background(demo_assets.base_model_dir, EngineConfig(device="cuda:63"))
    loading.wait()  # ends without raising
    with pytest.raises(ValueError, match="cuda:63"):
        loading.result()


def test_a_missing_checkpoint_is_raised_by_model(tmp_path: Path) -> None:
    loading = load_in_background(tmp_path, EngineConfig())
    with pytest.raises(CheckpointError):
        loading.result()
