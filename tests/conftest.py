"""Shared fixtures: the generated small demo model and adapters, built once per checkout.

The assets are cached under ``<repo>/.loraplex-assets`` (git-ignored); the generator itself
returns at once when a complete set with the same preset and seed is already there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# NOTE: Triton reads TRITON_INTERPRET once, when it is first imported, and peft imports it on
# its own; the Triton kernels are tested on CPU tensors through its interpreter
# (tests/ops/test_triton_backend.py), so it is set before any test module is collected.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Builders of adapter files byte by byte, and their fixtures, for every package's tests; the
# local Ray cluster the fleet tests share.
pytest_plugins = ["adapter_builders", "ray_cluster"]

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSET_CACHE = REPO_ROOT / ".loraplex-assets"


@pytest.fixture(autouse=True)
def _loraplex_logger_as_it_was() -> Iterator[None]:
    """A command run in-process (``serve``, ``fleet up`` through CliRunner) configures the
    ``loraplex`` logger (``serve/logs.py``: its own handler, no propagation); put back after
    each test, so that ``caplog`` still sees the lines of later tests."""
    logger = logging.getLogger("loraplex")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.fixture(scope="session")
def demo_assets() -> DemoAssets:
    from loraplex.demo.assets import generate_demo_assets

    return generate_demo_assets(ASSET_CACHE / "test-small", preset="small", seed=0)


@pytest.fixture(scope="session")
def reduced_demo_assets(tmp_path_factory: pytest.TempPathFactory) -> DemoAssets:
    """The reduced ``small`` set of seed 0 (tests/reduced_demo.py), generated once per session
    for the tests that check the generator itself (not cached: they check a fresh generation)."""
    from reduced_demo import generate_reduced

    return generate_reduced(tmp_path_factory.mktemp("reduced") / "seed0", "small", 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests skip cleanly on machines without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
