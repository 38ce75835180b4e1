"""Generator contract: reproducible bytes, seed sensitivity, caching, atomic replacement."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from reduced_demo import generate_reduced
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.demo import generate as generate_module
from loraplex.demo.assets import (
    STAMP_NAME,
    DemoAssets,
    demo_assets_ready,
    generate_demo_assets,
)
from loraplex.demo.presets import DemoPreset


def _file_states(root: Path) -> dict[str, tuple[int, int]]:
    return {
        path.relative_to(root).as_posix(): (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
    }


# Same preset and seed -> identical bytes: checked where a reduced set is generated again, in a
# child (tests/server/test_front_demo_assets.py), against the session's reduced set used here.


@pytest.mark.slow
def test_other_seed_differs_and_second_call_is_cached(
    reduced_demo_assets: DemoAssets, tmp_path: Path
) -> None:
    first = reduced_demo_assets  # seed 0
    other = generate_reduced(tmp_path / "seed1", "small", 1)
    assert other.base_digest != first.base_digest
    assert {a.digest for a in other.adapters}.isdisjoint(a.digest for a in first.adapters)
    before = _file_states(other.root)
    root_state = (other.root.stat().st_ino, other.root.stat().st_mtime_ns)
    assert generate_reduced(tmp_path / "seed1", "small", 1) == other
    assert _file_states(other.root) == before
    assert (other.root.stat().st_ino, other.root.stat().st_mtime_ns) == root_state
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed1"]
    # A base-only set: the whole set's base model bytes, no adapters; each kind of set is
    # ready only as itself, so neither stands in for the other.
    base = generate_reduced(tmp_path / "base0", "small", 0, adapters=False)
    assert base.adapters == () and base.base_digest == first.base_digest
    assert demo_assets_ready(base.root, "small", 0, adapters=False)
    assert not demo_assets_ready(base.root, "small", 0)
    assert not demo_assets_ready(first.root, "small", 0, adapters=False)
    assert generate_reduced(tmp_path / "base0", "small", 0, adapters=False) == base


def test_ready_checks_arguments_presence_and_sizes(demo_assets: DemoAssets, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(demo_assets.root, copy)
    assert demo_assets_ready(copy, "small", 0)
    assert not demo_assets_ready(copy, "small", 1)
    assert not demo_assets_ready(copy, "large", 0)
    weights = (
        demo_assets.adapters[0].path.relative_to(demo_assets.root) / "adapter_model.safetensors"
    )
    with (copy / weights).open("ab") as handle:
        handle.write(b"\0")
    assert not demo_assets_ready(copy, "small", 0)
    (copy / weights).unlink()
    assert not demo_assets_ready(copy, "small", 0)
    assert not demo_assets_ready(tmp_path / "missing", "small", 0)


def test_stale_set_is_replaced_whole(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    shutil.copytree(demo_assets.root, out)
    (out / "leftover.txt").write_text("from an older generator", encoding="utf-8")
    stamp = json.loads((out / STAMP_NAME).read_text(encoding="utf-8"))
    stamp["generator_version"] = 0
    (out / STAMP_NAME).write_text(json.dumps(stamp), encoding="utf-8")

    def fake_generate(root: Path, preset: DemoPreset, seed: int, *, adapters: bool) -> None:
        _copy_generated_files(demo_assets, root)

    monkeypatch.setattr(generate_module, "generate", fake_generate)
    assets = generate_demo_assets(out, "small", 0)
    assert not (out / "leftover.txt").exists()
    assert demo_assets_ready(out, "small", 0)
    assert [a.digest for a in assets.adapters] == [a.digest for a in demo_assets.adapters]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_generate(root: Path, preset: DemoPreset, seed: int, *, adapters: bool) -> None:
        (root / "manifest.json").write_text("{}", encoding="utf-8")
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_module, "generate", failing_generate)
    with pytest.raises(KeyboardInterrupt):
        generate_demo_assets(tmp_path / "out", "small", 0)
    assert list(tmp_path.iterdir()) == []


def test_staging_left_by_a_killed_run_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f".out.tmp-{dead.pid}"
    live = tmp_path / f".out.tmp-{os.getppid()}"  # a running process: not ours to delete
    for staging in (abandoned, live):
        staging.mkdir()
        (staging / "config.json").write_text("{}", encoding="utf-8")

    def failing_generate(root: Path, preset: DemoPreset, seed: int, *, adapters: bool) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_module, "generate", failing_generate)
    with pytest.raises(KeyboardInterrupt):
        generate_demo_assets(tmp_path / "out", "small", 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]


def test_a_killed_runs_staging_is_removed_when_the_set_is_ready(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    # The set was made meanwhile by another run, so no generation ran and the killed run's
    # `.test-small.tmp-NNN` stayed for good. A pid in a name may be reused: a running process
    # that started after the directory's last write is not its writer.
    out = tmp_path / "out"
    shutil.copytree(demo_assets.root, out)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f".out.tmp-{dead.pid}"
    retired = tmp_path / f".out.old-{dead.pid}"
    reused = tmp_path / f".out.old-{os.getppid()}"
    live = tmp_path / f".out.tmp-{os.getppid()}"  # its writer runs: not ours to delete
    for staging in (abandoned, retired, reused, live):
        staging.mkdir()
    os.utime(reused, (0, 0))  # last written long before the running process started
    assert generate_demo_assets(out, "small", 0).root == out.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", live.name])


def test_unknown_preset_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="preset 'huge' is invalid"):
        generate_demo_assets(tmp_path / "out", "huge", 0)
    assert list(tmp_path.iterdir()) == []


def test_cli_reports_cached_set(demo_assets: DemoAssets) -> None:
    before = _file_states(demo_assets.root)
    result = CliRunner().invoke(app, ["demo-assets", "--out", str(demo_assets.root), "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert f"{len(demo_assets.adapters)} adapter revisions" in result.output
    assert "loraplex-demo-small" in result.output
    assert _file_states(demo_assets.root) == before


@pytest.mark.parametrize(
    "command",
    [
        ["demo-assets", "--out", "x"],
        ["demo", "--out", "x"],  # it was a ValueError traceback after argument parsing
        # it started a server and ran part of the matrix before the preset was read
        ["qualify", "--self", "--report-dir", "x"],
    ],
)
def test_cli_rejects_unknown_preset(tmp_path: Path, command: list[str]) -> None:
    args = [str(tmp_path / a) if a == "x" else a for a in command]
    result = CliRunner().invoke(app, [*args, "--preset", "huge"])
    assert result.exit_code == 2, result.output
    assert "huge" in result.output and "--preset" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rank", ["0", "-1"])
def test_demo_refuses_a_bad_max_lora_rank_before_generating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: str
) -> None:
    """`loraplex demo --max-lora-rank 0` generated the demo set (minutes on a first run), then
    ended in a ValueError traceback; now a usage error naming the flag, before anything runs."""
    generated: list[Path] = []
    monkeypatch.setattr(
        "loraplex.demo.assets.generate_demo_assets", lambda *a: generated.append(a[0])
    )
    result = CliRunner().invoke(
        app, ["demo", "--out", str(tmp_path / "x"), "--max-lora-rank", rank]
    )
    assert result.exit_code == 2, result.output
    assert "--max-lora-rank" in result.output and f"max_lora_rank {rank}" in result.output
    assert generated == [] and list(tmp_path.iterdir()) == []


def test_a_second_caller_waits_for_the_first_and_does_not_generate_again(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes starting on a fresh checkout (or two test workers) ask for the same missing
    # set: one generates, the other waits and then finds it ready.
    started, release = threading.Event(), threading.Event()
    calls: list[Path] = []

    def slow_generate(root: Path, preset: DemoPreset, seed: int, *, adapters: bool) -> None:
        calls.append(root)
        started.set()
        release.wait(timeout=30)
        _copy_generated_files(demo_assets, root)

    monkeypatch.setattr(generate_module, "generate", slow_generate)
    out = tmp_path / "out"
    results: list[DemoAssets] = []
    first = threading.Thread(target=lambda: results.append(generate_demo_assets(out, "small", 0)))
    first.start()
    assert started.wait(timeout=30)
    second = threading.Thread(target=lambda: results.append(generate_demo_assets(out, "small", 0)))
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive()  # waiting on the first one's lock, not generating
    release.set()
    first.join(timeout=60)
    second.join(timeout=60)
    assert len(calls) == 1
    assert [a.root for a in results] == [out.resolve(), out.resolve()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock file left behind


def _copy_generated_files(demo_assets: DemoAssets, root: Path) -> None:
    """What a generation writes into its staging directory (all but the stamp), copied from the
    test set: a stand-in for the minutes of training."""
    for item in demo_assets.root.iterdir():
        if item.is_dir():
            shutil.copytree(item, root / item.name)
        elif item.name != STAMP_NAME:
            shutil.copy(item, root / item.name)
