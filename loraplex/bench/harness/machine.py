"""What a benchmark records about the machine it ran on: ratios between two servers moved
several-fold between an AVX-512 and an AVX2-only machine (docs/benchmarks/peer.md), and a
number measured on a busy machine must say so."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

# Vector extensions that decide which kernels CPU builds can run.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The machine's CPU model and which of ``ISA_FLAGS`` it has; model "unknown" and no flags
    where ``cpuinfo`` cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {"model": "unknown", "isa": []}
    model, flags = "unknown", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "isa": [flag for flag in ISA_FLAGS if flag in flags]}


def machine_record() -> dict[str, Any]:
    """The CPU, its core count, the 1-minute load average when the run ended (a shared machine
    shows here) and the Python that ran the benchmark."""
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {
        "cpu": cpu_description(),
        "cores": os.cpu_count(),
        "load_1m": load,
        "python": platform.python_version(),
    }
