"""Our decoder's logits equal transformers' for the same checkpoint (float32, relative < 1e-4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F
from tiny_models import hf_model, rel_error

from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.layers import PackedLinear, onednn_linear, packed_available
from loraplex.model.llama import DecoderLayer, ForwardBatch, LlamaModel

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
YARN_MSCALE = {
    "rope_type": "yarn",
    "factor": 3.0,
    "original_max_position_embeddings": 16,
    "mscale": 0.8,
    "mscale_all_dim": 0.5,
    "beta_fast": 16,
    "beta_slow": 2,
}
QWEN2_WINDOW = {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-bias-mha": (
        "llama",
        {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 4},
    ),
    "llama-head-dim": ("llama", {"head_dim": 32}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    "qwen2": ("qwen2", {}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen2-window": ("qwen2", QWEN2_WINDOW),
    "rope-theta": ("llama", {"rope_theta": 500_000.0}),
    "rope-linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "rope-llama3": ("llama", {"rope_scaling": LLAMA3, "rope_theta": 500.0}),
    "rope-yarn": ("llama", {"rope_scaling": YARN}),
    "rope-yarn-mscale": ("qwen2", {"rope_scaling": YARN_MSCALE}),
    # max_position_embeddings 8 < the 14-token input: dynamic NTK actually rescales here.
    "rope-dynamic": (
        "llama",
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8},
    ),
}


def run_full(model: LlamaModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits at every position of one sequence, computed in a single prefill."""
    kv = ContiguousKVCache(
        model.attention_shape, 1, ids.numel(), dtype=model.dtype, device=model.device
    )
    chunk = SequenceChunk(kv.allocate(), 0, ids.numel())
    return model.forward_batch(ForwardBatch.build(ids, [chunk], all_logits=True), kv)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case: str, tiny_model: Callable[..., Path]) -> None:
    arch, overrides = CASES[case]
    model_dir = tiny_model(arch, **overrides)
    ids = torch.randint(0, 97, (14,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf_model(model_dir)(ids[None]).logits[0]
    got = run_full(load_checkpoint(model_dir), ids)
    assert got.shape == want.shape
    assert rel_error(got, want) < 1e-4


@pytest.mark.parametrize("kernel", ["blas", "onednn", "packed"])
@pytest.mark.parametrize("case", ["llama-bias-mha", "qwen2-tied", "llama"])
def test_each_linear_kernel_matches_transformers(
    kernel: str, case: str, tiny_model: Callable[..., Path]
) -> None:
    """Every kernel, over a bias, a tied head and GQA; every base linear runs the chosen one
    (the packed kernel: the model's one PackedLinear, holding a copy of every weight it ran)."""
    if kernel != "blas" and not packed_available():
        pytest.skip("this torch has no oneDNN linear or cannot pack weights")
    arch, overrides = CASES[case]
    model_dir = tiny_model(arch, **overrides)
    ids = torch.randint(0, 97, (14,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf_model(model_dir)(ids[None]).logits[0]
    model = load_checkpoint(model_dir, linear_kernel=kernel)
    assert model.linear_kernel == kernel
    # the load packs them all, before any step: seven per layer and the head (a tied one: the
    # embedding's matrix); other kernels pack nothing
    packed = 7 * len(model.model.layers) + 1 if kernel == "packed" else 0
    if kernel == "packed":
        assert len(cast(PackedLinear, model._linear)) == packed
    assert model.prepack() == 0  # nothing left to pack
    chosen = {"onednn": onednn_linear, "blas": F.linear}.get(kernel, model._linear)
    assert all(cast(DecoderLayer, layer).run_linear is chosen for layer in model.model.layers)
    assert rel_error(run_full(model, ids), want) < 1e-4
    if kernel == "packed":
        assert isinstance(chosen, PackedLinear) and len(chosen) == packed


def test_a_load_may_leave_packing_to_its_caller(tiny_model: Callable[..., Path]) -> None:
    """``prepack=False`` (the engine's load, which packs on a thread of its own): nothing is
    packed, the layers run the dense weights with the same logits, ``prepack`` packs them."""
    if not packed_available():
        pytest.skip("this torch has no oneDNN linear or cannot pack weights")
    model_dir = tiny_model("llama")
    ids = torch.randint(0, 97, (14,), generator=torch.Generator().manual_seed(5))
    model = load_checkpoint(model_dir, prepack=False)
    assert model.linear_kernel == "packed" and len(cast(PackedLinear, model._linear)) == 0
    dense = run_full(model, ids)
    assert model.prepack() == 7 * len(model.model.layers) + 1
    assert torch.equal(run_full(model, ids), dense)
    assert torch.equal(dense, run_full(load_checkpoint(model_dir, linear_kernel="onednn"), ids))


def test_legacy_rope_scaling_spelling_loads_the_same(tiny_model: Callable[..., Path]) -> None:
    """A transformers 4.x config (rope_theta + rope_scaling with ``type``) means the same thing."""
    import json

    model_dir = tiny_model("llama", rope_scaling={"rope_type": "linear", "factor": 2.0})
    ids = torch.arange(1, 12)
    new_style = run_full(load_checkpoint(model_dir), ids)
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params["rope_theta"]
    config["rope_scaling"] = {"type": "linear", "factor": params["factor"]}
    config_path.write_text(json.dumps(config))
    assert torch.equal(run_full(load_checkpoint(model_dir), ids), new_style)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bfloat16_tracks_float32(arch: str, tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model(arch)
    ids = torch.randint(0, 97, (12,), generator=torch.Generator().manual_seed(5))
    fp32 = run_full(load_checkpoint(model_dir), ids)
    bf16 = run_full(load_checkpoint(model_dir, dtype=torch.bfloat16), ids)
    assert bf16.dtype == torch.bfloat16
    with torch.no_grad():
        hf_bf16 = hf_model(model_dir, torch.bfloat16)(ids[None]).logits[0]
    # The yardstick is transformers in bfloat16: our rounding error may not exceed its own by much.
    assert rel_error(bf16, fp32) < max(2 * rel_error(hf_bf16, fp32), 1e-2)
    agree = (bf16.float().argmax(-1) == fp32.argmax(-1)).float().mean()
    assert agree >= 0.9
