"""bench/front: the /proc probes on real processes, the config's refusals, and the summary's
failure and undefined-ratio rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.bench.front.bench import FrontBenchConfig, Tree, _ratios, _summary
from loraplex.bench.front.probe import mapped_libraries, memory_of, torch_mapped

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_probe_sees_torch_mapped_here_and_not_in_a_plain_python() -> None:
    import torch

    assert torch.ones(1).item() == 1.0
    assert torch_mapped(os.getpid())
    plain = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert plain.stdout is not None and plain.stdout.readline() == b"up\n"  # it runs
        assert mapped_libraries(plain.pid, "python")  # the probe reads its maps at all
        assert not torch_mapped(plain.pid)
        memory = memory_of(plain.pid)
        assert 0 < memory.rss_bytes <= memory.peak_rss_bytes
    finally:
        plain.communicate(b"")


def test_probe_of_a_gone_process_raises() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(RuntimeError, match="is gone"):
        memory_of(gone.pid)


def test_config_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    here = Tree("here", REPO_ROOT)
    with pytest.raises(ValueError, match="trees"):
        FrontBenchConfig((), tmp_path)
    with pytest.raises(ValueError, match="distinct"):
        FrontBenchConfig((here, Tree("here", REPO_ROOT)), tmp_path)
    with pytest.raises(ValueError, match="runs 0"):
        FrontBenchConfig((here,), tmp_path, runs=0)
    with pytest.raises(ValueError, match="checkout root"):
        Tree("nowhere", tmp_path)


def _run(tree: str, ok: bool, ready_s: float) -> dict[str, object]:
    if not ok:
        return {"tree": tree, "ok": False, "error": "RuntimeError: exited"}
    measures = dict.fromkeys(
        ("start_to_health_s", "front_rss_mib", "front_peak_rss_mib", "engine_rss_mib"), 1.0
    )
    return {
        "tree": tree,
        "ok": True,
        "start_to_ready_s": ready_s,
        "front_torch_mapped": False,
        **measures,
    }


def test_summary_counts_failures_and_a_missing_side_gives_null_ratios() -> None:
    trees = (Tree("before", REPO_ROOT), Tree("after", REPO_ROOT))
    before = _summary(
        [_run("before", True, 4.0), _run("before", True, 6.0), _run("before", False, 0)]
    )
    assert before["failed"] == 1 and before["runs"] == 3
    assert before["start_to_ready_s"] == {"median": 5.0, "min": 4.0, "max": 6.0}
    after = _summary([_run("after", False, 0)])
    assert after["start_to_ready_s"] is None and after["front_torch_mapped"] == []
    ratios = _ratios(trees, {"before": before, "after": after})
    assert ratios["start_to_ready_s"] == {"after_over_before": None}
    halved = _summary([_run("after", True, 2.5)])
    ratios = _ratios(trees, {"before": before, "after": halved})
    assert ratios["start_to_ready_s"] == {"after_over_before": 0.5}
