"""The GPU check's plumbing, run on the CPU: the child pytest, the benchmark call, the JSON line,
the refusals. The check itself (CUDA, compiled Triton) runs in ``test_device_check_on_cuda``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import loraplex.bench.device_check as device_check
from loraplex.bench.device_check import CheckConfig, check

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "device-check"


def test_cpu_check_runs_the_gpu_tests_and_the_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    # One file of gpu tests keeps the child's collection short; the real check takes them all.
    monkeypatch.setattr(device_check, "GPU_TEST_PATHS", ("tests/model/test_cuda.py",))
    line, status = check(CheckConfig("cpu", "auto", "float32", 4, 1, 1, 120.0))
    assert status == 0 and line["ok"] is True
    tests = line["tests"]
    assert isinstance(tests, dict)
    # Without CUDA every gpu test is collected and skipped, none passes or fails.
    assert tests["skipped"] >= 1 and tests["passed"] == 0 and tests["failed"] == 0
    execution = line["execution"]
    assert isinstance(execution, dict) and execution["batch_size"] == 4
    for key in ("base_tokens_per_s", "mixed_over_base", "torch_grouped_over_base"):
        assert isinstance(execution[key], float) and execution[key] > 0, key
    assert execution["backend_over_best_torch"] is not None
    json.dumps(line)  # one JSON line


def test_missing_modules_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(device_check.NEEDED, "no_such_module_xyz", "no-such-dist")
    line, status = check(CheckConfig.for_device("cpu"))
    assert status == 3 and line["missing"] == ["no-such-dist"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_check_without_a_device_is_refused() -> None:
    line, status = check(CheckConfig.for_device("cuda"))
    assert status == 2 and "no CUDA device" in str(line["error"])


def test_script_wraps_the_module() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run([str(SCRIPT), "--help"], env=env, capture_output=True, text=True,
                          check=False, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--cpu" in done.stdout and "--prepare-wheels" in done.stdout


@pytest.mark.gpu
def test_device_check_on_cuda() -> None:
    """The whole check on a CUDA machine: compiled kernels pass, the benchmark ran on Triton."""
    line, status = check(CheckConfig.for_device("cuda"))
    assert status == 0, line
    execution = line["execution"]
    assert isinstance(execution, dict) and execution["backend"] == "triton"
