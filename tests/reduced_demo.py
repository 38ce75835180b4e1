"""A reduced ``small`` demo preset, for the tests that must generate a demo set themselves.

One adapter and 30 base steps (of 100): the adapter still learns its probe (in about 60 of its
200 steps), and a set costs a tenth of the full preset. Generation runs the same pipeline for
it (corpus, tokenizer, base model, every adapter of the preset, manifest, stamp), so the
properties checked with it are the generator's, not the preset's: a seed reaches every file
(tests/demo/test_generation.py), the same seed writes the same bytes in another process, and a
missing set is generated in a child (tests/server/test_front_demo_assets.py).

Torch-free at import, like ``loraplex.demo.assets``: a server process may import it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from unittest import mock

from loraplex.demo import assets as assets_module
from loraplex.demo.assets import DemoAssets
from loraplex.demo.presets import get_preset

REDUCED = replace(get_preset("small"), base_steps=30, adapters=get_preset("small").adapters[:1])


def reduced_presets(name: str) -> object:
    """``get_preset`` with ``small`` reduced (a stand-in for ``loraplex.demo.assets``'s)."""
    return {"small": REDUCED}[name]


def generate_reduced(out: Path, preset: str, seed: int, *, adapters: bool = True) -> DemoAssets:
    """``generate_demo_assets`` with ``small`` reduced. A module-level function, so that a
    spawned child (``serve.assembly.demo_assets``'s generator process) can import it by name."""
    with mock.patch.object(assets_module, "get_preset", reduced_presets):
        return assets_module.generate_demo_assets(out, preset, seed, adapters=adapters)
