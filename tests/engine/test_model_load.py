"""The checkpoint loaded on a thread beside the engine's start (``engine/model_load.py``): the
same model as a load in place, and the load's error raised where its result is asked for; with
packed weights the packing on a thread of its own after the load, and its failure logged."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from loraplex.engine.config import EngineConfig
from loraplex.engine.model_load import load_in_background, pack_in_background
from loraplex.errors import CheckpointError
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.layers import PackedLinear, packed_available

if TYPE_CHECKING:
    from pathlib import Path

    from loraplex.demo.assets import DemoAssets


def test_the_background_model_equals_one_loaded_in_place(demo_assets: DemoAssets) -> None:
    model_dir = demo_assets.base_model_dir
    loaded = load_in_background(model_dir, EngineConfig()).result()
    expected = dict(load_checkpoint(model_dir).named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, expected[name]), name


def test_the_load_packs_on_a_thread_of_its_own(
    demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load returns before packing (the first steps run the dense weights); the packing
    thread it starts packs every base linear and the head."""
    if not packed_available():
        pytest.skip("this torch cannot pack weights")
    started: list[object] = []

    def pack_later(model: object) -> None:
        started.append(model)

    monkeypatch.setattr("loraplex.engine.model_load.pack_in_background", pack_later)
    model = load_in_background(demo_assets.base_model_dir, EngineConfig()).result()
    packed = model._linear
    assert started == [model] and isinstance(packed, PackedLinear) and len(packed) == 0
    monkeypatch.undo()
    assert pack_in_background(model).result() == 7 * len(model.model.layers) + 1
    assert model.prepack() == 0


def test_a_failed_packing_is_logged(
    demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = load_checkpoint(demo_assets.base_model_dir, prepack=False)

    def broken() -> int:
        raise RuntimeError("no memory for the packed copies")

    monkeypatch.setattr(model, "prepack", broken)
    with pytest.raises(RuntimeError, match="no memory"):
        pack_in_background(model).result()
    assert "packing the base weights failed" in caplog.text


def test_a_bad_device_is_raised_by_model(demo_assets: DemoAssets) -> None:
    loading = load_in_background(demo_assets.base_model_dir, EngineConfig(device="cuda:63"))
    loading.wait()  # ends without raising
    with pytest.raises(ValueError, match="cuda:63"):
        loading.result()


def test_a_missing_checkpoint_is_raised_by_model(tmp_path: Path) -> None:
    loading = load_in_background(tmp_path, EngineConfig())
    with pytest.raises(CheckpointError):
        loading.result()
