"""The floating-point dtypes loraplex runs and stores adapters in: the one table of them.

Torch-free at import (the HTTP process, the registry and configs validate dtype names with it);
``torch_dtype`` imports torch only when it is called. The names are torch's own attribute names,
so they read the same in configs, flags, the registry and logs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# dtype name -> bytes per element, in the order help texts list them (the default first).
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPE_BYTES)
DEFAULT_DTYPE = "float32"
# safetensors header dtype codes of the dtypes above (adapters are accepted in these only).
SAFETENSORS_CODES: dict[str, str] = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def check_dtype(name: str, field: str = "dtype") -> str:
    """``name`` when it is a known dtype; ValueError naming ``field`` otherwise."""
    if name not in DTYPE_BYTES:
        raise ValueError(f"{field} {name!r} is invalid; expected one of {list(DTYPE_NAMES)}")
    return name


def bytes_per_element(name: str) -> int:
    """Bytes of one element of the dtype ``name`` (ValueError for an unknown name)."""
    return DTYPE_BYTES[check_dtype(name)]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``name`` (imports torch)."""
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    return table[check_dtype(name)]
