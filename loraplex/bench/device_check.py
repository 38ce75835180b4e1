"""``scripts/device-check``: the GPU check, one JSON line (issue 27, item 5).

On a machine with a CUDA device it (1) runs every ``gpu``-marked test (the compiled Triton kernels
against the CPU reference, the model on CUDA) in a child process where Triton compiles for real,
then (2) runs the execution benchmark's headline on the device: bfloat16, batch 32 over 16
distinct adapters, base next to the mixed batch on the Triton backend and on the torch backends
(grouped, masked, the per-adapter loop), interleaved in one run by one clock with the device
synchronised around every timed block.

``--cpu`` runs the same two steps on the CPU with the torch backend, so the plumbing (argument
handling, the child pytest, the benchmark call, the JSON line) is tested where CI runs; its GPU
tests are all skipped there, and it says so. A missing module is reported by name, with how to
carry it (``--prepare-wheels`` downloads wheels for a machine without a package registry).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

REPO_ROOT = Path(__file__).resolve().parents[2]
# The tests that carry the gpu marker live here (tests/conftest.py skips them without CUDA).
GPU_TEST_PATHS = ("tests/ops", "tests/model")
# Modules the check imports, with the distribution that provides each.
NEEDED = {
    "torch": "torch",
    "numpy": "numpy",
    "safetensors": "safetensors",
    "re2": "google-re2",
    "pytest": "pytest",
    "hypothesis": "hypothesis",
    "transformers": "transformers",
    "peft": "peft",
}
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


@dataclass(frozen=True)
class CheckConfig:
    """What one device check runs."""

    device: str  # "cuda", or "cpu" for the plumbing check
    backend: str  # the mixed pools' LoRA backend: "triton" on CUDA, "auto" on the CPU
    dtype: str  # headline dtype
    batch_size: int  # sequences per step, over 16 distinct adapters
    rounds: int  # interleaved timing rounds
    calls_per_round: int  # timed forwards per variant per round
    tests_timeout_s: float  # bound on the child pytest

    @classmethod
    def for_device(cls, device: str) -> CheckConfig:
        if device == "cuda":
            return cls("cuda", "triton", "bfloat16", 32, 12, 8, 300.0)
        return cls("cpu", "auto", "float32", 32, 1, 1, 120.0)


def missing_modules() -> list[str]:
    """Modules the check needs that this interpreter cannot import."""
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def probe() -> dict[str, object]:
    """What the check runs on: versions, the device, the CPU's vector extensions."""
    import torch

    cuda = torch.cuda.is_available()
    triton = importlib.util.find_spec("triton") is not None
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "device_name": torch.cuda.get_device_name(0) if cuda else None,
        "triton": _version("triton") if triton else None,
        "cpu_flags": _cpu_flags(),
    }


def run_gpu_tests(timeout_s: float) -> dict[str, object]:
    """The gpu-marked tests in a child process, Triton compiling for real (no interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_INTERPRET"] = "0"  # tests/conftest.py defaults it to 1 for the CPU's sake
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [*command, *GPU_TEST_PATHS],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"rc": None, "timed_out": True, "wall_s": round(time.perf_counter() - started, 1)}
    counts = {kind.rstrip("s"): int(n) for n, kind in _COUNT.findall(_summary(done.stdout))}
    return {
        "rc": done.returncode,
        "timed_out": False,
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0),
        "skipped": counts.get("skipped", 0),
        "wall_s": round(time.perf_counter() - started, 1),
        "tail": None if done.returncode == 0 else (done.stdout + done.stderr)[-2000:],
    }


def run_execution(config: CheckConfig) -> dict[str, object]:
    """The execution headline on the device; base vs mixed, the configured backend vs torch's."""
    from loraplex.bench.execution.bench import ExecutionBenchConfig, run_execution_bench

    bench = ExecutionBenchConfig(
        dtypes=(config.dtype,),
        rounds=config.rounds,
        calls_per_round=config.calls_per_round,
        matrix=False,
        peft=False,
        device=config.device,
        backend=config.backend,
        batch_size=config.batch_size,
    )
    with tempfile.TemporaryDirectory() as tmp:
        metrics = cast(dict[str, float], run_execution_bench(bench, workdir=Path(tmp))["metrics"])
    suffix = "" if config.dtype == "float32" else f"_{config.dtype}"

    def get(key: str) -> float | None:
        value = metrics.get(f"{key}{suffix}")
        return None if value is None else round(float(value), 4)

    torch_best = max(
        (v for v in (get(f"mixed_{n}_over_base") for n in ("grouped", "masked", "loop")) if v),
        default=None,
    )
    mixed = get("mixed_over_base")
    return {
        "dtype": config.dtype,
        "batch_size": config.batch_size,
        "adapters": 16,
        "backend": config.backend,
        "rounds": config.rounds,
        "base_tokens_per_s": get("base_tokens_per_s"),
        "mixed_tokens_per_s": get("mixed_tokens_per_s"),
        "mixed_over_base": mixed,
        "mixed_r16_over_base": get("mixed_r16_over_base"),
        "torch_grouped_over_base": get("mixed_grouped_over_base"),
        "torch_masked_over_base": get("mixed_masked_over_base"),
        "torch_loop_over_base": get("mixed_loop_over_base"),
        # The configured backend over the best torch backend on the same batch (null if undefined).
        "backend_over_best_torch": None
        if mixed is None or not torch_best
        else round(mixed / torch_best, 4),
    }


def check(config: CheckConfig) -> tuple[dict[str, object], int]:
    """The whole check: its JSON object and the exit status (0 = every part passed)."""
    started = time.perf_counter()
    line: dict[str, object] = {"name": "device-check", "device": config.device}
    missing = missing_modules()
    if missing:
        line["missing"] = [NEEDED[name] for name in missing]
        line["hint"] = "carry wheels: scripts/device-check --prepare-wheels, then carry .whl"
        return line, 3
    line["probe"] = found = probe()
    if config.device == "cuda" and not found["cuda_available"]:
        line["error"] = "no CUDA device is visible to torch; run with --cpu for the plumbing check"
        return line, 2
    tests = run_gpu_tests(config.tests_timeout_s)
    line["tests"] = tests
    line["execution"] = run_execution(config)
    line["wall_s"] = round(time.perf_counter() - started, 1)
    tests_ok = tests["rc"] == 0 or (config.device == "cpu" and tests["failed"] == 0)
    # On the CPU every gpu test is skipped, so pytest's "no tests ran" exit (5) is expected.
    ok = bool(tests_ok) and not tests["timed_out"]
    line["ok"] = ok
    return line, 0 if ok else 1


def prepare_wheels(target: Path) -> int:
    """Download wheels of the modules a CUDA image may lack (Python 3.12, manylinux x86-64)."""
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 27, 28)] + ["manylinux2014_x86_64"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", "-d", str(target)]
    for platform in platforms:
        command += ["--platform", platform]
    return subprocess.run([*command, "google-re2"], check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/device-check", description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="the plumbing check on the CPU")
    parser.add_argument(
        "--prepare-wheels", metavar="DIR", help="download wheels to carry to the device, then exit"
    )
    args = parser.parse_args(argv)
    if args.prepare_wheels:
        return prepare_wheels(Path(args.prepare_wheels))
    line, status = check(CheckConfig.for_device("cpu" if args.cpu else "cuda"))
    sys.stdout.write(json.dumps(line) + "\n")
    return status


def _summary(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def _cpu_flags() -> list[str]:
    """The CPU's vector extensions (AVX-512, AMX) from /proc/cpuinfo, where there is one."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return sorted(f for f in set(flags) if f.startswith(("avx512", "amx", "avx2")))


if __name__ == "__main__":
    raise SystemExit(main())
