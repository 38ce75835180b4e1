"""``qualify --self`` generates a missing demo set before its server starts. The server used to
generate it, inside its start's deadline (``selfserve.START_TIMEOUT_S``): from a fresh checkout
on a loaded 2-core machine the training outlasted it, and the README's ``qualify --self --quick
--json`` stopped with "did not become ready within 300.0 s", the set half written."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import loraplex.demo.assets
from loraplex.bench.harness.process import Launch
from loraplex.demo.assets import DemoAssets, demo_assets_ready
from loraplex.qualify import selfserve
from loraplex.serve.assembly import DEMO_PRESET, DEMO_SEED


class _Launched(Exception):
    """Raised in place of the server once its launch is in hand."""


def test_a_missing_demo_set_is_generated_before_the_server_starts(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = tmp_path / "assets"
    events: list[str] = []
    real_generate = loraplex.demo.assets.generate_demo_assets

    def generate(out: Path, preset: str, seed: int) -> DemoAssets:
        # the minutes of training stood in by the set the test session trained (same preset)
        events.append(f"generate {preset} {seed}")
        shutil.copytree(demo_assets.root, out)
        return real_generate(out, preset, seed)  # finds it complete: reads its manifest

    @contextmanager
    def launched(launch: Launch) -> Iterator[None]:
        ready = demo_assets_ready(assets.resolve(), DEMO_PRESET, DEMO_SEED)
        events.append(f"launch ready={ready}")
        raise _Launched
        yield  # a generator, as serving_process is

    monkeypatch.setattr(loraplex.demo.assets, "generate_demo_assets", generate)
    monkeypatch.setattr(selfserve, "serving_process", launched)
    said: list[Path] = []
    with pytest.raises(_Launched), selfserve.self_server(assets, tmp_path / "run", 1, said.append):
        pass
    assert events == [f"generate {DEMO_PRESET} {DEMO_SEED}", "launch ready=True"]
    assert said == [assets]

    events.clear()  # the next run finds it: nothing generated, nothing said
    with pytest.raises(_Launched), selfserve.self_server(assets, tmp_path / "run2", 1, said.append):
        pass
    assert events == ["launch ready=True"] and said == [assets]
