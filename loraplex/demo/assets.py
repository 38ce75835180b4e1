"""Generate (or reuse) the demo base model and adapters: the public entry points.

Generation is deterministic (same preset and seed → byte-identical files) and cached: a stamp
file lists every file with its size and sha256, and a later call whose stamp matches the
arguments and whose files are all present with those sizes returns without touching anything.
A set is built in a temporary sibling directory and renamed into place, so an interrupted
run never leaves a directory that looks complete.

Torch-free at import time: only generation imports the training stack.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loraplex.artifacts.identity import sha256_file
from loraplex.demo.manifest import DemoAdapter, DemoAssets, read_manifest
from loraplex.demo.presets import get_preset

__all__ = [
    "GENERATOR_VERSION",
    "DemoAdapter",
    "DemoAssets",
    "demo_assets_ready",
    "generate_demo_assets",
    "load_demo_assets",
]

# Bumped whenever the generator would write different bytes for the same preset and seed.
GENERATOR_VERSION = 2
STAMP_NAME = "stamp.json"
PID_START_MARGIN_S = 2.0  # a staging dir's pid started this long after its last write: reused


def generate_demo_assets(
    out: Path, preset: str = "small", seed: int = 0, *, adapters: bool = True
) -> DemoAssets:
    """The demo set for ``preset``/``seed`` in ``out``, generated unless already there. With
    ``adapters=False``, the base model alone (its manifest lists no adapters): what a
    benchmark that writes its own adapters needs, without the adapters' fine-tunes (most of
    the large preset's generation time)."""
    preset_spec = get_preset(preset)
    out = out.resolve()
    # NOTE: before the ready check: a killed run's staging was left for good once another run
    # had made the set
    _remove_abandoned_staging(out)
    if demo_assets_ready(out, preset, seed, adapters=adapters):
        return read_manifest(out)
    from loraplex.demo.generate import generate

    out.parent.mkdir(parents=True, exist_ok=True)
    # Two processes asking for a missing set at once (two `serve` starts on a fresh checkout,
    # parallel test workers): the second waits for the first and then finds the set ready,
    # instead of generating it again and renaming a set away under the first one's readers.
    with _generation_lock(out):
        if demo_assets_ready(out, preset, seed, adapters=adapters):
            return read_manifest(out)
        staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            generate(staging, preset_spec, seed, adapters=adapters)
            _write_stamp(staging, preset, seed, adapters)
            _move_into_place(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return read_manifest(out)


@contextlib.contextmanager
def _generation_lock(out: Path) -> Iterator[None]:
    """An exclusive lock on ``.<name>.lock`` beside ``out`` while the set is generated; the
    kernel releases it when its holder dies, so a killed generator blocks no one. The file is
    removed on release: a waiter that then holds the lock of a removed file takes it again."""
    path = out.parent / f".{out.name}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def load_demo_assets(out: Path) -> DemoAssets:
    """Read an existing set's manifest (no generation, no torch)."""
    return read_manifest(out.resolve())


def demo_assets_ready(root: Path, preset: str, seed: int, *, adapters: bool = True) -> bool:
    """True when ``root`` holds a complete set for these arguments (stamp, presence, sizes);
    a stamp without ``adapters`` (written before base-only sets existed) is a whole set."""
    try:
        stamp = json.loads((root / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    expected = {"generator_version": GENERATOR_VERSION, "preset": preset, "seed": seed}
    if not isinstance(stamp, dict) or any(stamp.get(k) != v for k, v in expected.items()):
        return False
    if stamp.get("adapters", True) is not adapters:
        return False
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for relative, entry in files.items():
        path = root / relative
        if not path.is_file() or path.stat().st_size != entry.get("bytes"):
            return False
    return True


def _write_stamp(root: Path, preset: str, seed: int, adapters: bool) -> None:
    files: dict[str, Any] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        files[path.relative_to(root).as_posix()] = {
            "bytes": path.stat().st_size,
            "sha256": sha256_file(path),
        }
    stamp = {
        "generator_version": GENERATOR_VERSION,
        "preset": preset,
        "seed": seed,
        "adapters": adapters,
        "files": files,
    }
    text = json.dumps(stamp, indent=2, sort_keys=True) + "\n"
    (root / STAMP_NAME).write_text(text, encoding="utf-8")


def _remove_abandoned_staging(out: Path) -> None:
    """Delete staging (``.tmp-PID``) and retired (``.old-PID``) directories of ``out`` whose
    writer no longer runs (killed); a running writer's are left alone."""
    if not out.parent.is_dir():
        return
    for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*"):
        for staging in out.parent.glob(pattern):
            pid = staging.name.rsplit("-", 1)[-1]
            if pid.isdigit() and _writer_gone(int(pid), staging):
                shutil.rmtree(staging, ignore_errors=True)


def _writer_gone(pid: int, staging: Path) -> bool:
    """NOTE: pids are reused (a restarted container counts from 1 again): a process that
    started after ``staging`` was last written is not its writer."""
    if not _process_alive(pid):
        return True
    started = _process_start_time(pid)
    try:
        written = staging.stat().st_mtime
    except OSError:  # removed meanwhile
        return False
    # btime has whole seconds: a margin so that a writer is never taken for a newcomer
    return started is not None and started > written + PID_START_MARGIN_S


def _process_start_time(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds) from /proc; None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
        boot = Path("/proc/stat").read_text(encoding="ascii")
    except OSError:
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the name
    btime = next(int(line.split()[1]) for line in boot.splitlines() if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _move_into_place(staging: Path, out: Path) -> None:
    """Replace ``out`` (stale or absent) by ``staging`` with directory renames."""
    if out.exists():
        retired = out.parent / f".{out.name}.old-{os.getpid()}"
        shutil.rmtree(retired, ignore_errors=True)
        out.rename(retired)
        shutil.rmtree(retired)
    staging.rename(out)
