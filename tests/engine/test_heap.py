"""The engine process keeps the memory its steps free (``engine.heap``): blocks the size of a
step's activations, freed and allocated again, are not faulted in again; both hosts of an engine
(its own process, a thread of the server) set it before they build anything."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.serve import engine_side
from loraplex.serve.config import ServeConfig

REPO = Path(__file__).resolve().parents[2]

# A step's pattern in miniature: a few blocks of several MiB allocated, written and freed, over
# and over; prints the page faults of the last ten rounds. argv[1] "keep": keep_freed_heap first.
_ROUNDS = """
import ctypes, ctypes.util, resource, sys
if sys.argv[1] == "keep":
    from loraplex.engine.heap import keep_freed_heap
    assert keep_freed_heap()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
sizes = (6 << 20, 2 << 20, 5 << 20, 3 << 20)
def round_():
    blocks = [libc.malloc(size) for size in sizes]
    for block, size in zip(blocks, sizes):
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
round_(); round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode],
        capture_output=True, text=True, timeout=120, check=True, cwd=REPO,
    )  # fmt: skip
    return int(done.stdout)


@pytest.mark.skipif(
    sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc's malloc"
)
def test_freed_blocks_are_not_faulted_in_again() -> None:
    pages = (16 << 20) // 4096  # one round's blocks
    assert _faults("default") > 5 * pages  # glibc's defaults hand them back every round
    assert _faults("keep") < pages // 10  # kept: the rounds reuse the same pages


class _Called(Exception):
    pass


def _raise() -> bool:
    raise _Called


def test_an_engine_process_keeps_freed_memory_before_it_builds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from loraplex.serve import engine_process

    monkeypatch.setattr(engine_process, "keep_freed_heap", _raise)
    with pytest.raises(_Called):  # first: before the model or the registry is touched
        engine_side.build_worker(ServeConfig(data_dir=tmp_path), tmp_path / "no-model")


def test_an_engine_thread_keeps_freed_memory_before_it_builds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(engine_side, "keep_freed_heap", _raise)
    with pytest.raises(_Called):
        engine_side.start_engine_here(
            ServeConfig(data_dir=tmp_path),
            None,  # type: ignore[arg-type]  # never reached
            None,  # type: ignore[arg-type]
            tmp_path / "no-model",
        )


def test_a_fleet_replica_keeps_freed_memory_before_it_builds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from loraplex.engine import heap
    from loraplex.fleet.replica import build_replica_parts

    monkeypatch.setattr(heap, "keep_freed_heap", _raise)
    with pytest.raises(_Called):
        build_replica_parts(ServeConfig(data_dir=tmp_path), tmp_path / "no-model", "r0")
