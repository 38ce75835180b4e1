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
    """The machine's CPU model, which of ``ISA_FLAGS`` it has, and its vendor, family and model
    number (a virtual machine's "AMD EPYC" names a Zen 4 and a Zen 5 alike, whose kernels
    differ: family 25 and 26); model "unknown", no flags and None where ``cpuinfo`` cannot be
    read or lacks the line."""
    description: dict[str, Any] = {
        "model": "unknown",
        "isa": [],
        "vendor": None,
        "family": None,
        "model_id": None,
    }
    try:
        text = cpuinfo.read_text()
    except OSError:
        return description
    flags = set[str]()
    numbers = {"cpu family": "family", "model": "model_id"}
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and description["model"] == "unknown":
            description["model"] = value
        elif key == "flags" and not flags:
            flags = set(value.split())
        elif key == "vendor_id" and description["vendor"] is None:
            description["vendor"] = value
        elif key in numbers and description[numbers[key]] is None and value.isdigit():
            description[numbers[key]] = int(value)
    description["isa"] = [flag for flag in ISA_FLAGS if flag in flags]
    return description


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
