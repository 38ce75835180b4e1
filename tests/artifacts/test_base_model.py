"""BaseModelSpec: shapes of the injectable linears, supported architectures, checkpoint digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraplex.artifacts.base_model import BaseModelSpec, base_model_digest, digest_checkpoint
from loraplex.errors import BaseModelMismatchError, CorruptArtifactError

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 100,
}


def model_dir(root: Path, **overrides: object) -> Path:
    directory = root / "my-base"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**CONFIG, **overrides}))
    (directory / "model.safetensors").write_bytes(bytes(range(200)))
    return directory


def test_from_dir_reads_shapes_and_name(tmp_path: Path) -> None:
    spec = BaseModelSpec.from_dir(model_dir(tmp_path))
    assert (spec.name, spec.architecture, spec.num_layers) == ("my-base", "LlamaForCausalLM", 2)
    assert (spec.head_dim, spec.num_kv_heads) == (8, 2)
    assert spec.module_shape("q_proj") == (64, 64)
    assert spec.module_shape("k_proj") == (64, 16)
    assert spec.module_shape("o_proj") == (64, 64)
    assert spec.module_shape("down_proj") == (96, 64)
    assert spec.module_shape("gate_proj") == (64, 96)
    assert spec.digest == base_model_digest(tmp_path / "my-base")
    with pytest.raises(KeyError, match="lm_head"):
        spec.module_shape("lm_head")


def test_module_path() -> None:
    assert BaseModelSpec.module_path(3, "k_proj") == "model.layers.3.self_attn.k_proj"
    assert BaseModelSpec.module_path(0, "up_proj") == "model.layers.0.mlp.up_proj"


def test_explicit_head_dim_is_honoured(tmp_path: Path) -> None:
    spec = BaseModelSpec.from_dir(model_dir(tmp_path, head_dim=16))
    assert spec.module_shape("q_proj") == (64, 128)
    assert spec.module_shape("o_proj") == (128, 64)


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "MixtralForCausalLM"])
def test_unsupported_architecture_is_rejected(tmp_path: Path, architecture: str) -> None:
    with pytest.raises(BaseModelMismatchError, match=architecture):
        BaseModelSpec.from_dir(model_dir(tmp_path, architectures=[architecture]))


def test_bad_config(tmp_path: Path) -> None:
    with pytest.raises(CorruptArtifactError, match="hidden_size"):
        BaseModelSpec.from_dir(model_dir(tmp_path, hidden_size=0))
    (tmp_path / "my-base" / "config.json").write_text("{oops")
    with pytest.raises(CorruptArtifactError, match="not valid JSON"):
        BaseModelSpec.from_dir(tmp_path / "my-base")
    with pytest.raises(BaseModelMismatchError, match=r"no config\.json"):
        BaseModelSpec.from_dir(tmp_path / "missing")


def test_digest_changes_with_one_weight_byte_and_ignores_tokenizer(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    before = base_model_digest(directory)
    (directory / "tokenizer.json").write_text('{"model": {}}')
    (directory / "tokenizer_config.json").write_text("{}")
    (directory / "README.md").write_text("notes")
    assert base_model_digest(directory) == before
    weights = bytearray((directory / "model.safetensors").read_bytes())
    weights[100] ^= 1
    (directory / "model.safetensors").write_bytes(bytes(weights))
    changed = base_model_digest(directory)
    assert changed != before
    weights[100] ^= 1
    (directory / "model.safetensors").write_bytes(bytes(weights))
    assert base_model_digest(directory) == before
    (directory / "config.json").write_text(json.dumps({**CONFIG, "vocab_size": 101}))
    assert base_model_digest(directory) != before


def test_digest_binds_file_boundaries(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    (directory / "model.safetensors").unlink()
    (directory / "a.safetensors").write_bytes(b"abc")
    (directory / "b.safetensors").write_bytes(b"def")
    first = base_model_digest(directory)
    (directory / "a.safetensors").write_bytes(b"ab")
    (directory / "b.safetensors").write_bytes(b"cdef")
    assert base_model_digest(directory) != first


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads 3"),
        ({"num_key_value_heads": "2"}, "num_key_value_heads"),
        ({"head_dim": 2.5}, "head_dim"),
        ({"hidden_size": 4, "num_attention_heads": 8}, "head_dim"),
    ],
)
def test_inconsistent_head_layout_is_rejected(
    tmp_path: Path, overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(CorruptArtifactError, match=field):
        BaseModelSpec.from_dir(model_dir(tmp_path, **overrides))


def test_missing_kv_heads_defaults_to_query_heads(tmp_path: Path) -> None:
    config = {k: v for k, v in CONFIG.items() if k != "num_key_value_heads"}
    spec = BaseModelSpec.from_config("m", config, "0" * 64)
    assert spec.num_kv_heads == 8
    assert spec.module_shape("k_proj") == (64, 64)


def test_a_digest_taken_before_is_reused_while_the_files_are_unchanged(tmp_path: Path) -> None:
    """The engine process takes the server's digest (``DigestedCheckpoint``) instead of reading
    the weights again, but only while every digested file stats the same."""
    directory = model_dir(tmp_path)
    digested = digest_checkpoint(directory)
    assert digested.digest == base_model_digest(directory)
    assert digested.matches(directory)
    fake = type(digested)(directory, digested.stamps, "f" * 64)  # tells reuse from a new read
    assert BaseModelSpec.from_dir(directory, fake).digest == "f" * 64
    assert not fake.matches(tmp_path / "elsewhere")
    (directory / "model.safetensors").write_bytes(bytes(range(1, 201)))  # same size, new bytes
    assert not fake.matches(directory)
    assert BaseModelSpec.from_dir(directory, fake).digest == base_model_digest(directory)
    (directory / "extra.safetensors").write_bytes(b"x")  # a file more is digested too
    renewed = digest_checkpoint(directory)
    assert renewed.matches(directory) and renewed.digest != digested.digest
    (directory / "extra.safetensors").unlink()
    assert not renewed.matches(directory)
