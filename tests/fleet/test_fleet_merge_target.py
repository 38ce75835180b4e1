"""``fleet up`` with ``mode = "merged:<tenant/name@revision>"`` naming a revision the registry
lacks says so once, as ``serve`` does (``serve/merge_target.py``): the fleet's start said nothing
and its replicas merged nothing. No Ray: the warning is ``control.prepare``'s, before any
deployment."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.demo.manifest import DemoAssets
from loraplex.fleet import control
from loraplex.registry import open_registry
from loraplex.serve.bootstrap import register_demo
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_settings import registry_config


def _prepare(config: ServeConfig, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The WARNING lines ``prepare`` logs for ``config``."""
    with caplog.at_level(logging.WARNING, logger="loraplex"):
        control.prepare(config)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_merge_target_the_registry_lacks_is_warned_about(
    tmp_path: Path, demo_assets: DemoAssets, caplog: pytest.LogCaptureFixture
) -> None:
    mode = "merged:acme/suport@r1"
    config = ServeConfig(data_dir=tmp_path, model=demo_assets.base_model_dir, demo=False, mode=mode)
    (said,) = _prepare(config, caplog)
    assert said.startswith(f"mode {mode}: no revision acme/suport@r1 is registered; nothing")


@pytest.mark.parametrize("mode", ["merged:acme/support@r1", "unmerged", "auto"])
def test_a_registered_target_or_no_target_says_nothing(
    tmp_path: Path, demo_assets: DemoAssets, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    config = ServeConfig(data_dir=tmp_path, model=demo_assets.base_model_dir, demo=False, mode=mode)
    registry = open_registry(
        registry_config(config), base=BaseModelSpec.from_dir(demo_assets.base_model_dir)
    )
    try:
        register_demo(registry, demo_assets)
    finally:
        registry.close()
    assert _prepare(config, caplog) == []
