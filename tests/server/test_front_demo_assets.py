"""``serve.assembly.demo_assets``: a demo set already there is adopted as is; a missing one is
generated in a child process, so the server process that asked stays torch-free, and with the
same bytes as the session's set of the same preset and seed (the reduced ``small`` preset of
tests/reduced_demo.py on both sides: generating the full one again took over a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.demo.assets import STAMP_NAME, DemoAssets, demo_assets_ready
from loraplex.serve import assembly
from loraplex.serve.config import ServeConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


def _adopted(data_dir: Path) -> DemoAssets:
    found = assembly.demo_assets(ServeConfig(data_dir=data_dir))
    assert found is not None
    return found


def test_a_configured_model_needs_no_demo_set(tmp_path: Path) -> None:
    assert assembly.demo_assets(ServeConfig(data_dir=tmp_path, model=tmp_path / "model")) is None
    assert not (tmp_path / assembly.DEMO_DIR).exists()


def test_a_demo_set_already_there_is_adopted(demo_assets: DemoAssets, tmp_path: Path) -> None:
    (tmp_path / assembly.DEMO_DIR).symlink_to(demo_assets.root, target_is_directory=True)
    adopted = _adopted(tmp_path)
    assert adopted.root == demo_assets.root.resolve()
    assert adopted.base_model_dir == demo_assets.base_model_dir


@pytest.mark.slow  # generates the reduced demo set in a child (and once per session)
def test_a_missing_demo_set_is_generated_in_a_child(
    reduced_demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Also the generator's reproducibility check: the child generates the session's reduced
    set (tests/reduced_demo.py: the whole pipeline, a tenth of the full preset's training) with
    the same preset name and seed again, in another process, and must write the same bytes."""
    assert (reduced_demo_assets.preset, reduced_demo_assets.seed) == (
        assembly.DEMO_PRESET,
        assembly.DEMO_SEED,
    )
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from reduced_demo import generate_reduced\n"
        "from loraplex.serve import assembly\n"
        "from loraplex.serve.config import ServeConfig\n"
        "assembly.generate_demo_assets = generate_reduced  # what the spawned generator runs\n"
        "assets = assembly.demo_assets(ServeConfig(data_dir=Path(sys.argv[1])))\n"
        "print(assets.root, 'torch' in sys.modules)\n"
    )
    path = os.pathsep.join(str(p) for p in (REPO_ROOT, REPO_ROOT / "tests"))
    result = subprocess.run(
        [sys.executable, "-P", "-c", code, str(tmp_path)],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    root, torch_loaded = result.stdout.split()
    assert Path(root) == (tmp_path / assembly.DEMO_DIR).resolve()
    assert torch_loaded == "False"  # the generation trained with torch in a child
    assert demo_assets_ready(Path(root), assembly.DEMO_PRESET, assembly.DEMO_SEED)
    made = json.loads((Path(root) / STAMP_NAME).read_text())["files"]
    session = json.loads((reduced_demo_assets.root / STAMP_NAME).read_text())["files"]
    assert made == session  # the same preset and seed: the same files, sizes and sha256
    for path in reduced_demo_assets.root.rglob("*"):
        if path.is_file():
            again = Path(root) / path.relative_to(reduced_demo_assets.root)
            assert path.read_bytes() == again.read_bytes(), path
    adopted = _adopted(tmp_path)
    assert adopted.root == Path(root)  # and a second start adopts it
    assert [a.digest for a in adopted.adapters] == [a.digest for a in reduced_demo_assets.adapters]
    assert adopted.base_digest == reduced_demo_assets.base_digest
