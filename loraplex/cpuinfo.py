"""What ``/proc/cpuinfo`` says about the CPU, read by the kernel rules (``model.layers``: which
kernel runs on which CPU) and by the benchmarks' machine record (``bench.harness.machine``).

Torch-free; empty where the file cannot be read (another OS, another architecture).
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def first_processor(cpuinfo: str | Path = CPUINFO) -> dict[str, str]:
    """Each field of the first processor's block (``vendor_id``, ``cpu family``, ``model``,
    ``model name``, ``flags``, ...) as written, stripped; {} when the file cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as info:
            for line in info:
                if not line.strip():
                    if fields:
                        break  # the first block is enough: every core of one CPU says the same
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    return fields


def cpu_vendor(cpuinfo: str | Path = CPUINFO) -> str:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...); empty without one."""
    return first_processor(cpuinfo).get("vendor_id", "")


def cpu_family(cpuinfo: str | Path = CPUINFO) -> int | None:
    """The CPU's family number (AMD: 25 = Zen 3 and Zen 4, 26 = Zen 5); None without one or
    where it is not a number."""
    value = first_processor(cpuinfo).get("cpu family", "")
    return int(value) if value.isdigit() else None
