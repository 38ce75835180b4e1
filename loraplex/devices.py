"""The torch devices loraplex runs on: ``cpu``, ``cuda`` and ``cuda:N``.

Torch-free at import (the HTTP process and configs check a device name with ``check_device``
before anything starts); ``torch_device`` imports torch, when it is called, to check that the
device is there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,4})?")
ACCEPTED = "cpu, cuda or cuda:N"


def check_device(name: str, field: str = "device") -> str:
    """``name`` when it is a device string we run on; ValueError naming ``field`` otherwise
    (torch's own error for ``tpu`` named neither the key nor what is accepted)."""
    if not isinstance(name, str) or _DEVICE.fullmatch(name) is None:
        raise ValueError(f"{field} {name!r} is invalid; expected {ACCEPTED}")
    return name


def torch_device(name: str, field: str = "device") -> torch.device:
    """The torch device ``name``, once it is checked and present here (imports torch):
    ValueError naming ``field`` and the devices this machine has otherwise."""
    import torch

    check_device(name, field)
    if name == "cpu":
        return torch.device(name)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = 0 if name == "cuda" else int(name.partition(":")[2])
    if index >= count:
        present = "cpu" if count == 0 else f"cpu, cuda or cuda:0 to cuda:{count - 1}"
        raise ValueError(
            f"{field} {name!r} is invalid here; expected {present} (torch sees {count} CUDA "
            "devices)"
        )
    return torch.device(name)


def memory_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The machine's memory (``MemTotal``), or None where /proc/meminfo is not there."""
    try:
        lines = meminfo.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        if name == "MemTotal":
            return int(rest.split()[0]) * 1024  # kB
    return None
