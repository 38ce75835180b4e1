"""What ``/proc/cpuinfo`` says about the CPU, read by the kernel rules (``model.layers``: which
kernel runs on which CPU), the LoRA op's strategy costs (``ops.policy``: whether bfloat16 is
native) and by the benchmarks' machine record (``bench.harness.machine``).

Torch-free; empty where the file cannot be read (another OS, another architecture).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The x86 flags (Linux's names in /proc/cpuinfo) of native bfloat16 arithmetic: AVX-512's
# bfloat16 dot products and AMX's bfloat16 tiles. Without either, bfloat16 matmuls ran masked's
# wide steps 3.5-5.3x slower than grouped's (an AVX2 EPYC Milan; docs/modes.md, twentieth pass).
NATIVE_BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# The x86 flag of AMX's matrix tiles: there masked's wide 16-bit matmuls ran at about twice
# float32's rate (an Intel Xeon; docs/modes.md, thirteenth pass); on a CPU with AVX-512's
# bfloat16 dot products but no tiles (a Zen 4 EPYC) they did not (twenty-second pass).
MATRIX_TILE_FLAG = "amx_tile"


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


def cpu_flags(cpuinfo: str | Path = CPUINFO) -> frozenset[str]:
    """The first processor's ``flags`` (x86), each as written; empty without that field (another
    architecture, whose ``Features`` use other names, or an unreadable file)."""
    return frozenset(first_processor(cpuinfo).get("flags", "").split())


def bfloat16_emulated(flags: frozenset[str]) -> bool:
    """Whether an x86 CPU with ``flags`` (:func:`cpu_flags`) lacks native bfloat16 arithmetic
    (none of :data:`NATIVE_BFLOAT16_FLAGS`, e.g. an AVX2-only AMD EPYC Milan). False without
    flags: a CPU this cannot read keeps the costs fitted on native bfloat16 CPUs."""
    return bool(flags) and not flags & NATIVE_BFLOAT16_FLAGS


def matrix_tiles(flags: frozenset[str]) -> bool:
    """Whether an x86 CPU with ``flags`` (:func:`cpu_flags`) has AMX's matrix tiles
    (:data:`MATRIX_TILE_FLAG`). True without flags: a CPU this cannot read keeps the costs
    fitted on the CPU with tiles."""
    return not flags or MATRIX_TILE_FLAG in flags


@cache
def this_cpu_matrix_tiles() -> bool:
    """:func:`matrix_tiles` of this machine's /proc/cpuinfo (read once per process)."""
    return matrix_tiles(cpu_flags())


@cache
def this_cpu_bfloat16_emulated() -> bool:
    """:func:`bfloat16_emulated` of this machine's /proc/cpuinfo (read once per process)."""
    return bfloat16_emulated(cpu_flags())
