"""The demo set a comparator run measures on, and the per-run places its servers use."""

from __future__ import annotations

import tempfile
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec, read_model_config
from loraplex.demo.manifest import DemoAssets, read_manifest
from loraplex.model.config import context_window
from loraplex.qualify.baselines.types import BaselineContext


def load_assets(ctx: BaselineContext) -> DemoAssets:
    """The demo set of ``ctx``; ValueError when it was generated with another preset."""
    assets = read_manifest(ctx.assets_dir)
    if assets.preset != ctx.preset:
        raise ValueError(
            f"BaselineContext.preset {ctx.preset!r} does not match the assets in "
            f"{ctx.assets_dir} (preset {assets.preset!r})"
        )
    return assets


def vocab_size(assets: DemoAssets) -> int:
    """The base model's vocabulary size (random prompt ids are drawn below it)."""
    return BaseModelSpec.from_dir(assets.base_model_dir).vocab_size


def context_tokens(model_dir: Path) -> int:
    """The model's context in tokens: the most any of its servers takes in one sequence."""
    window, _ = context_window(read_model_config(model_dir))
    return window


def max_model_len(prompt_tokens: int, output_tokens: int, model_dir: Path) -> int:
    """A server's sequence bound for a shape: the shape, rounded up to a 16-token block, never
    below loraplex serve's default, and never above the model's context (``context_window``;
    serve refuses more): a longer prompt is then the server's 400, as on any deployment of it."""
    need = prompt_tokens + output_tokens
    return min(context_tokens(model_dir), max(512, -(-need // 16) * 16))


def server_dir(ctx: BaselineContext, kind: str) -> Path:
    """A new data directory for one comparator server (kept: its log and config stay)."""
    root = ctx.workdir / "servers"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))


def cache_of(ctx: BaselineContext) -> Path:
    """Where the run's measurements are kept."""
    return ctx.workdir / "baselines-cache"
