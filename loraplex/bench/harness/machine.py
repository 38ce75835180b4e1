"""What a benchmark records about the machine it ran on: ratios between two servers moved
several-fold between an AVX-512 and an AVX2-only machine (docs/benchmarks/peer.md), and a
number measured on a busy machine must say so."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from loraplex.cpuinfo import CPUINFO, cpu_family, first_processor

# Vector extensions that decide which kernels CPU builds can run.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def cpu_description(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """The machine's CPU model, which of ``ISA_FLAGS`` it has, and its vendor, family and model
    number (a virtual machine's "AMD EPYC" names a Zen 4 and a Zen 5 alike, whose kernels
    differ: family 25 and 26); model "unknown", no flags and None where ``cpuinfo`` cannot be
    read or lacks the line."""
    fields = first_processor(cpuinfo)
    flags = set(fields.get("flags", "").split())
    model_id = fields.get("model", "")
    return {
        "model": fields.get("model name") or "unknown",
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "vendor": fields.get("vendor_id"),
        "family": cpu_family(cpuinfo),
        "model_id": int(model_id) if model_id.isdigit() else None,
    }


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
