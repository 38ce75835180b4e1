"""The configured base model's digest started ahead (``cli/serve_start.digest_ahead``) and
taken by ``build_server`` only when it is of the model served; what it raised is raised there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraplex.artifacts.base_model import base_model_digest, digest_checkpoint
from loraplex.background import Background
from loraplex.cli.serve_start import digest_ahead
from loraplex.serve.assembly import _digested
from loraplex.serve.config import ServeConfig


def model_dir(root: Path, weights: bytes) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (root / "model.safetensors").write_bytes(weights)
    return root


def test_the_digest_ahead_is_of_the_configured_model(tmp_path: Path) -> None:
    assert digest_ahead(ServeConfig(data_dir=tmp_path / "data")) is None  # the demo set
    model = model_dir(tmp_path / "m", b"weights")
    ahead = digest_ahead(ServeConfig(data_dir=tmp_path / "data", model=model))
    assert ahead is not None
    digested = _digested(model, ahead)
    assert digested.digest == base_model_digest(model) and digested.matches(model)


def test_a_digest_ahead_of_another_directory_is_not_taken(tmp_path: Path) -> None:
    served, other = model_dir(tmp_path / "a", b"one"), model_dir(tmp_path / "b", b"two")
    ahead = Background(lambda: digest_checkpoint(other), "test-digest")
    assert _digested(served, ahead).digest == base_model_digest(served)


def test_what_the_digest_ahead_raised_is_raised_where_it_is_taken(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    ahead = Background(lambda: digest_checkpoint(missing), "test-digest")
    with pytest.raises(FileNotFoundError):
        _digested(missing, ahead)
