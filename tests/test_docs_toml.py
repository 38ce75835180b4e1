"""Every TOML block in README.md and docs/ is a config file loraplex accepts: its ``[serve]``
table as ``serve --config`` reads it, its ``[fleet]`` table as ``fleet up --config`` and
``k8s render --ray --serve-config`` check it. kubernetes.md showed a ``[fleet]`` table (``pow2``
with a router key and a topology) that every one of them refused."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from loraplex.deploy.fleet_file import check_fleet_values
from loraplex.serve.config.file import merge, read_config_file

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```toml\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for i, match in enumerate(BLOCK.finditer(text)):
            found.append((f"{path.relative_to(ROOT)}#{i}", match.group(1)))
    return found


BLOCKS = _blocks()
DEFAULT_REPLICAS = 2  # what ``fleet up`` and ``k8s render`` run without ``--replicas``


def test_the_docs_hold_toml_blocks() -> None:
    names = [name for name, _ in BLOCKS]
    assert any(n.startswith("docs/kubernetes.md") for n in names), names
    assert any(n.startswith("docs/operations.md") for n in names), names


@pytest.mark.parametrize(("name", "text"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_a_docs_toml_block_is_a_config_loraplex_accepts(
    name: str, text: str, tmp_path: Path
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    serve = merge(read_config_file(path, other_tables=("fleet",)), {"data_dir": tmp_path})
    fleet = tomllib.loads(text).get("fleet")
    if fleet is not None:
        check_fleet_values(fleet, serve, DEFAULT_REPLICAS)


def test_a_refused_fleet_table_fails_here(tmp_path: Path) -> None:
    """The check can fail: kubernetes.md's old block is refused."""
    old = '[serve]\npolicy = "lru"\n[fleet]\npolicy = "pow2"\n[fleet.router]\nmax_queued = 4\n'
    with pytest.raises(ValueError, match="max_queued"):
        test_a_docs_toml_block_is_a_config_loraplex_accepts("old", old, tmp_path)
