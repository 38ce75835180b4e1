"""Strict checkpoint loading: sharded files, and typed errors for anything that does not fit."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import hf_model, rel_error, vm_flags

from loraplex.errors import CheckpointError
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.config import ModelConfig
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch


def rewrite_weights(model_dir: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def edit_config(model_dir: Path, **changes: object) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_sharded_checkpoint_loads(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    model_dir = tiny_model("llama")
    sharded = tmp_path / "sharded"
    hf_model(model_dir).save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    ids = torch.arange(2, 12)
    outputs = []
    for directory in (model_dir, sharded):
        model = load_checkpoint(directory)
        kv = ContiguousKVCache(
            model.attention_shape, 1, 16, dtype=torch.float32, device=model.device
        )
        batch = ForwardBatch.build(ids, [SequenceChunk(kv.allocate(), 0, 10)], all_logits=True)
        outputs.append(model.forward_batch(batch, kv))
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "missing"),
        (lambda t: t.update({"model.layers.9.extra.weight": torch.zeros(2)}), "unexpected"),
        (lambda t: t.update({"lm_head.weight": torch.zeros(97, 32)}), "shape"),
        (lambda t: t.update({"model.norm.weight": torch.zeros(64, dtype=torch.int32)}), "dtype"),
    ],
    ids=["missing", "unexpected", "mis-shaped", "integer"],
)
def test_mismatched_tensors_are_rejected(
    edit: Callable[[dict[str, torch.Tensor]], None], message: str, tiny_model: Callable[..., Path]
) -> None:
    model_dir = tiny_model("llama")
    rewrite_weights(model_dir, edit)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(model_dir)


def test_qwen2_without_its_qkv_bias_is_rejected(tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model("qwen2")
    rewrite_weights(model_dir, lambda t: t.pop("model.layers.0.self_attn.k_proj.bias"))
    with pytest.raises(CheckpointError, match=r"k_proj\.bias"):
        load_checkpoint(model_dir)


def test_tied_head_written_anyway_is_accepted(tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model("llama", tie_word_embeddings=True)
    rewrite_weights(
        model_dir, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()})
    )
    model = load_checkpoint(model_dir)
    assert model.lm_head is None


def test_pickle_only_checkpoint_is_refused(tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model("llama")
    (model_dir / "model.safetensors").rename(model_dir / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint(model_dir)


def test_truncated_file_is_a_checkpoint_error(tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model("llama")
    (model_dir / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(model_dir)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type"),
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ],
)
def test_unsupported_configs_name_the_field(
    changes: dict[str, object], field: str, tiny_model: Callable[..., Path]
) -> None:
    model_dir = tiny_model("llama")
    edit_config(model_dir, **changes)
    with pytest.raises(CheckpointError, match=field):
        ModelConfig.from_dir(model_dir)


def test_config_fields(tiny_model: Callable[..., Path]) -> None:
    qwen = ModelConfig.from_dir(
        tiny_model("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1)
    )
    assert (qwen.qkv_bias, qwen.o_bias, qwen.sliding_windows) == (True, False, (None, 16))
    mistral = ModelConfig.from_dir(tiny_model("mistral", sliding_window=8))
    assert mistral.sliding_windows == (8, 8)
    assert (mistral.head_dim, mistral.num_kv_heads, mistral.eos_token_ids) == (16, 2, (2,))
    llama = ModelConfig.from_dir(tiny_model("llama", attention_bias=True))
    assert (llama.qkv_bias, llama.o_bias, llama.rope.rope_type) == (True, True, "default")


def test_bfloat16_checkpoint_upcasts_exactly(tiny_model: Callable[..., Path]) -> None:
    model_dir = tiny_model("llama")
    rewrite_weights(model_dir, lambda t: t.update({k: v.bfloat16() for k, v in t.items()}))
    model = load_checkpoint(model_dir)
    stored = load_file(model_dir / "model.safetensors")["model.norm.weight"]
    assert model.model.norm.weight.dtype == torch.float32
    assert rel_error(model.model.norm.weight, stored.float()) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_large_weights_load_onto_huge_pages_with_their_exact_values(
    tiny_model: Callable[..., Path],
) -> None:
    """A weight of 2 MiB or more (here the embedding and the untied head, 8192 x 64 float32) is
    read from memory advised MADV_HUGEPAGE (the decode step reads it whole); values unchanged."""
    model_dir = tiny_model("llama", vocab_size=8192, tie_word_embeddings=False)
    model = load_checkpoint(model_dir)
    stored = load_file(model_dir / "model.safetensors")
    assert model.lm_head is not None
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        param = model.get_parameter(name)
        assert "hg" in vm_flags(param) and "sh" not in vm_flags(param)
        assert torch.equal(param, stored[name])
    assert "hg" not in vm_flags(model.model.layers[0].mlp.up_proj.weight)  # 24 KiB
    for name, param in model.named_parameters():
        assert torch.equal(param, stored[name]), name
