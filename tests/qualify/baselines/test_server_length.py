"""A comparator server's sequence bound: the shape rounded up to a block, at least serve's
default, and never past the model's context, which serve refuses (the in-context comparator
once asked 1,280 tokens of a 512-token model and its server exited at start)."""

from __future__ import annotations

import json
from pathlib import Path

from loraplex.demo.assets import DemoAssets
from loraplex.qualify.baselines.demo_set import max_model_len


def test_the_bound_is_the_shape_within_the_models_context(demo_assets: DemoAssets) -> None:
    model = demo_assets.base_model_dir
    context = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    assert max_model_len(10, 5, model) == min(512, context)
    assert max_model_len(context + 100, 16, model) == context


def test_a_rope_scaled_model_gets_the_window_its_scaling_reaches(tmp_path: Path) -> None:
    raw = {"max_position_embeddings": 512, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert max_model_len(1000, 24, tmp_path) == 1024
    assert max_model_len(5000, 24, tmp_path) == 2048
