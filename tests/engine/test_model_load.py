"""The checkpoint loaded on a thread beside the engine's start (``engine/model_load.py``): the
same model as a load in place, and the load's error raised where its result is asked for; with
packed weights the packing on a thread of its own after the load, and its failure logged."""

from __future__ import annotations

import logging
from pathlib import Path
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


class _CountedLoads:
    """``model_load._load`` counted (the load ahead's and every load again)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from loraplex.engine import model_load

        self.models: list[object] = []
        real = model_load._load

        def load(model_dir: Path, config: EngineConfig) -> object:
            model = real(model_dir, config)
            self.models.append(model)
            return model

        monkeypatch.setattr(model_load, "_load", load)
        monkeypatch.setattr(model_load, "_AHEAD", [])


def _copy_model(demo_assets: DemoAssets, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(demo_assets.base_model_dir, tmp_path / "base"))


def test_a_load_started_ahead_is_taken_when_the_digest_covers_it(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine process's load started before its Build (``load_ahead``) is the build's
    model, with no second load, when the server's digest saw the same files."""
    from loraplex.artifacts.base_model import digest_checkpoint
    from loraplex.engine.model_load import load_ahead

    loads = _CountedLoads(monkeypatch)
    model_dir = _copy_model(demo_assets, tmp_path)
    load_ahead(model_dir, EngineConfig())
    digested = digest_checkpoint(model_dir)
    model = load_in_background(model_dir, EngineConfig(), digested).result()
    assert loads.models == [model]
    expected = dict(load_checkpoint(model_dir).named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param, expected[name]), name
    again = load_in_background(model_dir, EngineConfig(), digested).result()  # taken once only
    assert loads.models == [model, again]


def test_a_load_ahead_of_changed_files_is_loaded_again(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint file rewritten between the load ahead and the digest: the load ahead read
    other bytes than those digested, so it is dropped and the digested files loaded."""
    from loraplex.artifacts.base_model import digest_checkpoint
    from loraplex.engine.model_load import load_ahead

    loads = _CountedLoads(monkeypatch)
    model_dir = _copy_model(demo_assets, tmp_path)
    weights = sorted(model_dir.glob("*.safetensors"))[0]
    load_ahead(model_dir, EngineConfig())
    first = load_checkpoint(model_dir, prepack=False)  # not ``_load``: not counted
    import loraplex.engine.model_load as model_load

    assert len(model_load._AHEAD) == 1
    model_load._AHEAD[0].loading.wait()
    weights.write_bytes(weights.read_bytes())  # same bytes, a new ctime and mtime
    digested = digest_checkpoint(model_dir)
    model = load_in_background(model_dir, EngineConfig(), digested).result()
    assert len(loads.models) == 2 and loads.models[1] is model  # loaded again, after the digest
    expected = dict(first.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param, expected[name]), name


@pytest.mark.parametrize("case", ["no digest", "other directory", "other settings"])
def test_a_load_ahead_that_does_not_pass_is_loaded_again(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    from loraplex.artifacts.base_model import digest_checkpoint
    from loraplex.engine.model_load import load_ahead

    loads = _CountedLoads(monkeypatch)
    model_dir = _copy_model(demo_assets, tmp_path)
    other_dir = case == "other directory"
    ahead_dir = _copy_model(demo_assets, tmp_path / "other") if other_dir else model_dir
    kernel = "blas" if case == "other settings" else "auto"
    ahead_config = EngineConfig(base_linear_kernel=kernel)
    load_ahead(ahead_dir, ahead_config)
    digested = None if case == "no digest" else digest_checkpoint(model_dir)
    model = load_in_background(model_dir, EngineConfig(), digested).result()
    assert loads.models[-1] is model
    assert model.linear_kernel == load_checkpoint(model_dir, prepack=False).linear_kernel


def test_a_failed_load_ahead_is_loaded_again_and_its_error_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loraplex.engine.model_load import load_ahead

    loads = _CountedLoads(monkeypatch)
    load_ahead(tmp_path, EngineConfig())
    with pytest.raises(CheckpointError):
        load_in_background(tmp_path, EngineConfig(), None).result()
    assert loads.models == []


def test_a_second_load_ahead_is_refused(
    demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loraplex.engine.model_load import load_ahead

    _CountedLoads(monkeypatch)
    load_ahead(demo_assets.base_model_dir, EngineConfig())
    with pytest.raises(ValueError, match="already started ahead"):
        load_ahead(demo_assets.base_model_dir, EngineConfig())
    load_in_background(demo_assets.base_model_dir, EngineConfig()).wait()


@pytest.mark.parametrize("ahead", [False, True])
def test_a_load_of_files_changed_after_the_digest_fails(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: bool
) -> None:
    """attack26: a base file replaced after the server's digest was loaded and served under
    the old digest when no load was started ahead, or when the load ahead did not pass; the
    load now fails naming why (a restart digests the files anew)."""
    from loraplex.artifacts.base_model import digest_checkpoint
    from loraplex.engine.model_load import load_ahead

    loads = _CountedLoads(monkeypatch)
    model_dir = _copy_model(demo_assets, tmp_path)
    digested = digest_checkpoint(model_dir)
    weights = sorted(model_dir.glob("*.safetensors"))[0]
    weights.write_bytes(weights.read_bytes())  # same bytes, a new ctime and mtime
    if ahead:
        load_ahead(model_dir, EngineConfig())
    with pytest.raises(CheckpointError, match="files changed after they were digested"):
        load_in_background(model_dir, EngineConfig(), digested).result()
    assert len(loads.models) == (2 if ahead else 1)  # read, then refused
    # the digest of the files as they are now is taken
    load_in_background(model_dir, EngineConfig(), digest_checkpoint(model_dir)).result()
