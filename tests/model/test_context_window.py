"""``max_model_len`` against the checkpoint's context (``model.config.context_window``): at most
``max_position_embeddings``, or what a rope scaling the engine applies extends it to, as vLLM
derives it; above it is refused naming the key, the value and the model's limit (it was accepted
in silence). The offline engine refuses it too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_models import save_word_tokenizer

from loraplex.engine.offline import OfflineConfig, OfflineEngine
from loraplex.errors import CheckpointError
from loraplex.model.config import check_max_model_len, context_window

BASE = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096}


@pytest.mark.parametrize(
    ("extra", "window", "how"),
    [
        ({}, 4096, "max_position_embeddings 4096"),
        ({"rope_scaling": {"rope_type": "default"}}, 4096, "max_position_embeddings 4096"),
        (
            {"rope_scaling": {"type": "linear", "factor": 2.0}},
            8192,
            "max_position_embeddings 4096 x linear rope_scaling factor 2",
        ),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
            16384,
            "max_position_embeddings 4096 x dynamic rope_scaling factor 4",
        ),
        (  # transformers 5.x spelling
            {"rope_parameters": {"rope_type": "linear", "factor": 1.5, "rope_theta": 1e4}},
            6144,
            "max_position_embeddings 4096 x linear rope_scaling factor 1.5",
        ),
        (  # Qwen2.5's long-context recipe: 32768 x 4
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
            },
            131072,
            "original_max_position_embeddings 32768 x yarn rope_scaling factor 4",
        ),
        (  # llama3 rescales inside max_position_embeddings, already the extended context
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192,
                },
            },
            131072,
            "max_position_embeddings 131072",
        ),
    ],
)
def test_the_window_is_the_positions_the_rope_reaches(
    extra: dict[str, Any], window: int, how: str
) -> None:
    raw = {**BASE, **extra}
    assert context_window(raw) == (window, how)
    check_max_model_len(window, raw)  # the window itself is allowed
    with pytest.raises(ValueError) as refused:
        check_max_model_len(window + 1, raw)
    assert str(refused.value) == (
        f"max_model_len {window + 1} is invalid; expected at most {window}, the model's context "
        f"({how} in its config.json)"
    )


def test_a_config_without_its_context_is_a_checkpoint_error() -> None:
    with pytest.raises(CheckpointError, match="max_position_embeddings"):
        context_window({"architectures": ["LlamaForCausalLM"]})


def test_the_offline_engine_refuses_a_length_past_the_context(
    tiny_model: Callable[..., Path],
) -> None:
    model_dir = tiny_model()  # max_position_embeddings 128
    with pytest.raises(ValueError, match=r"^max_model_len 129 is invalid; expected at most 128"):
        OfflineEngine(model_dir, OfflineConfig(max_model_len=129))
    scaled = tiny_model(rope_scaling={"rope_type": "linear", "factor": 2.0})
    save_word_tokenizer(scaled)
    with OfflineEngine(scaled, OfflineConfig(max_model_len=256)) as engine:
        assert engine.core.scheduler.config.max_model_len == 256
