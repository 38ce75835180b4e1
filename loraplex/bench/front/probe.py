"""What a running process holds, read from Linux's ``/proc`` without asking the process: its
resident memory and whether torch's shared library is mapped into it (a module in
``sys.modules`` that imported torch leaves ``libtorch`` in ``/proc/PID/maps``).

Elsewhere these raise ``RuntimeError``, so a benchmark or test stops instead of reporting a
number it could not measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TORCH_LIBRARY = "libtorch"  # libtorch.so, libtorch_cpu.so, libtorch_python.so...


@dataclass(frozen=True)
class Memory:
    """One process's memory as the kernel counts it."""

    rss_bytes: int  # resident now (VmRSS)
    peak_rss_bytes: int  # the most it was ever resident (VmHWM)


def _read(pid: int, name: str) -> str:
    path = PROC / str(pid) / name
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError as exc:
        raise RuntimeError(
            f"cannot read {path}: process {pid} is gone or this is not Linux"
        ) from exc


def memory_of(pid: int) -> Memory:
    """``pid``'s resident and peak resident bytes (``/proc/PID/status``)."""
    fields: dict[str, int] = {}
    for line in _read(pid, "status").splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024  # reported in kB
    if len(fields) != 2:
        raise RuntimeError(f"/proc/{pid}/status has no VmRSS/VmHWM (a kernel thread?)")
    return Memory(fields["VmRSS"], fields["VmHWM"])


def mapped_libraries(pid: int, fragment: str) -> list[str]:
    """The files mapped into ``pid`` whose path contains ``fragment``, sorted, each once."""
    found = set()
    for line in _read(pid, "maps").splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and fragment in parts[5]:
            found.add(parts[5])
    return sorted(found)


def torch_mapped(pid: int) -> bool:
    """True when torch's native library is loaded into ``pid``."""
    return bool(mapped_libraries(pid, TORCH_LIBRARY))
