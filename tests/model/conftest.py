"""Fixtures for the model tests (helpers live in tiny_models.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_models import save_tiny_model


@pytest.fixture
def tiny_model(tmp_path: Path) -> Callable[..., Path]:
    counter = iter(range(1000))

    def make(arch: str = "llama", seed: int = 0, **overrides: Any) -> Path:
        return save_tiny_model(tmp_path / f"m{next(counter)}", arch, seed, **overrides)

    return make
