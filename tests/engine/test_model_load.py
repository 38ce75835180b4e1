"""The checkpoint loaded on a thread beside the engine's start (``engine/model_load.py``): the
same model as a load in place, and the load's error raised where its result is asked for; with
packed weights the packing on a thread of its own after the load, and its failure logged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import torch

from loraplex.engine.config import EngineConfig
from loraplex.engine.factory import build_engine_core
from loraplex.engine.model_load import load_in_background, pack_in_background
from loraplex.errors import CheckpointError
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.layers import PackedLinear, packed_available
from loraplex.model.llama import layer_linears, packable_bytes

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


@pytest.mark.parametrize("kernel", ["blas", "onednn", "packed"])
def test_base_linear_kernel_reaches_the_model_and_its_bytes_are_logged(
    demo_assets: DemoAssets, kernel: str, caplog: pytest.LogCaptureFixture
) -> None:
    """config -> engine's load -> the model's kernel; the packed copies' bytes (0 without
    them) appear in the start's log line beside the dense weights'."""
    if kernel != "blas" and not packed_available():
        pytest.skip("this torch has no oneDNN linear")
    caplog.set_level(logging.INFO, logger="loraplex.engine.model_load")
    model = load_in_background(
        demo_assets.base_model_dir, EngineConfig(base_linear_kernel=kernel)
    ).result()
    assert model.linear_kernel == kernel
    pack_in_background(model).result()
    packed = model._linear
    dense = sum(p.nbytes for p in model.parameters())
    if kernel == "packed":
        assert isinstance(packed, PackedLinear)
        copies = sum(entry[2].nbytes for entry in packed._packed.values())
        linears = [m.weight for layer in model.model.layers for m in layer_linears(layer)]
        head = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
        assert model.packed_bytes() == copies == sum(w.nbytes for w in [*linears, head]) > 0
        assert packable_bytes(model.config, model.dtype) == copies  # what auto weighs
    else:
        assert model.packed_bytes() == 0
    assert model.weight_bytes() == dense
    assert (
        f"base model weights: {dense} bytes dense, {model.packed_bytes()} bytes of packed "
        f"copies beside them (linear kernel {kernel})"
    ) in caplog.text


@pytest.mark.parametrize(("memory", "want"), [(None, "packed"), (8, "packed"), (7, "onednn")])
def test_auto_packs_only_while_the_copies_fit_an_eighth_of_the_machines_memory(
    demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch, memory: int | None, want: str
) -> None:
    """``auto``'s copies double the base weights' memory: a model whose copies would take more
    than ``AUTO_PACKED_MEMORY_SHARE`` of the machine's memory (None: unknown) runs ``onednn``
    on its one copy; asked for by name, ``packed`` is made whatever the memory."""
    if not packed_available():
        pytest.skip("this torch cannot pack weights")
    config = load_checkpoint(demo_assets.base_model_dir, prepack=False).config
    copies = packable_bytes(config, torch.float32)
    total = None if memory is None else copies * memory  # the copies 1/8 of it, then 1/7
    monkeypatch.setattr("loraplex.model.llama.memory_total_bytes", lambda: total)
    model = load_checkpoint(demo_assets.base_model_dir)
    assert model.linear_kernel == want
    assert model.packed_bytes() == (copies if want == "packed" else 0)
    named = load_checkpoint(demo_assets.base_model_dir, linear_kernel="packed")
    assert named.linear_kernel == "packed" and named.packed_bytes() == copies


def test_an_engine_built_without_a_loaded_model_takes_the_kernel(demo_assets: DemoAssets) -> None:
    core = build_engine_core(
        demo_assets.base_model_dir, EngineConfig(base_linear_kernel="blas"), None
    )
    assert core.runner.model.linear_kernel == "blas"


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
