"""A safetensors file's tensors read straight into the model's own parameters.

``safe_open(...).get_tensor`` returns a new tensor per name: the file's mapped bytes copied into
fresh heap memory, which ``load_checkpoint`` then copied again into the parameter (the first
write of its huge-page buffer, ``buffers.weight_buffer``). For the large preset that was 720 MiB
of heap touched and copied twice over at every start. Where the stored bytes already are the
parameter's value (same dtype, little-endian host, contiguous CPU parameter), ``read_into``
reads them into the parameter itself: one ``readinto`` per tensor, the kernel copying from the
page cache, no intermediate tensor. Anything else (a dtype to convert, a device) is left to
``get_tensor``.

The header is parsed here, bounded as safetensors bounds it (``MAX_HEADER_BYTES``), and every
byte range is checked against the file's size; ``checkpoint_files`` has opened the file with
safetensors itself before, so a header this module refuses is one changed since.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from io import FileIO
from pathlib import Path

import torch

from loraplex.errors import CheckpointError

# safetensors' own limit on the JSON header (its Rust reader refuses larger ones)
MAX_HEADER_BYTES = 100_000_000
# the dtypes whose stored little-endian bytes are a torch tensor's bytes as they are
DIRECT_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie in its safetensors file."""

    dtype: str  # the file's dtype code ("F32", "BF16", ...)
    shape: tuple[int, ...]  # as stored
    begin: int  # file offset of its first byte
    end: int  # file offset past its last byte


def stored_tensors(path: Path) -> dict[str, StoredTensor]:
    """Every tensor of the safetensors file ``path`` by name (its ``__metadata__`` left out);
    CheckpointError naming the file when the header is not a safetensors header for its size."""
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            header_bytes = int.from_bytes(handle.read(8), "little")
            if not 0 < header_bytes <= min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(f"header length {header_bytes} for a file of {size} bytes")
            header = json.loads(handle.read(header_bytes))
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise CheckpointError(f"{path}: unreadable safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: unreadable safetensors header (not an object)")
    data_start = 8 + header_bytes
    return {
        name: _stored(path, name, entry, data_start, size)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _stored(path: Path, name: str, entry: object, data_start: int, size: int) -> StoredTensor:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not (
        isinstance(dtype, str)
        and isinstance(shape, list)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(v) is int and v >= 0 for v in (*shape, *offsets))
    ):
        raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry")
    begin, end = offsets
    if not begin <= end <= size - data_start:
        raise CheckpointError(
            f"{path}: tensor {name!r} lies at bytes {begin}-{end} of a data section of "
            f"{size - data_start}; the file is truncated or corrupt"
        )
    return StoredTensor(dtype, tuple(shape), data_start + begin, data_start + end)


def direct_readable(stored: StoredTensor, target: torch.Tensor) -> bool:
    """Whether ``stored``'s bytes are ``target``'s value as they are (``read_into`` may fill it)."""
    return (
        sys.byteorder == "little"
        and target.device.type == "cpu"
        and target.is_contiguous()
        and DIRECT_DTYPES.get(stored.dtype) == target.dtype
        and stored.shape == tuple(target.shape)
        and stored.end - stored.begin == math.prod(stored.shape) * target.element_size()
    )


def read_into(handle: FileIO, stored: StoredTensor, target: torch.Tensor) -> None:
    """Fill ``target`` with ``stored``'s bytes from ``handle`` (the file, opened unbuffered);
    the caller checked ``direct_readable``. CheckpointError when the file ends early."""
    if target.numel() == 0:
        return
    view = target.detach().reshape(-1).view(torch.uint8).numpy().data
    handle.seek(stored.begin)
    done = 0
    while done < len(view):  # a read may return fewer bytes than asked
        count = handle.readinto(view[done:])
        if not count:
            raise CheckpointError(
                f"{getattr(handle, 'name', '?')}: ended {len(view) - done} bytes early"
            )
        done += count
