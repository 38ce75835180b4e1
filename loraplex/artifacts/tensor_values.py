"""Finiteness of tensor values, checked from their bit patterns without torch.

A float is NaN or infinite exactly when all its exponent bits are set, so each dtype is read as
unsigned integers of its width and masked; this treats bf16 (which numpy cannot represent) the
same way as f16 and f32. Reads go in bounded chunks, so memory never scales with the file.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO

import numpy as np

from loraplex.artifacts.safetensors_header import ByteReader
from loraplex.errors import CorruptArtifactError, TensorValidationError

# safetensors dtype -> (little-endian unsigned view, exponent mask).
_EXPONENT_MASKS: dict[str, tuple[str, int]] = {
    "F32": ("<u4", 0x7F80_0000),
    "F16": ("<u2", 0x7C00),
    "BF16": ("<u2", 0x7F80),
}
_CHUNK_BYTES = 4 << 20


def check_finite(reader: ByteReader, name: str, dtype: str, num_bytes: int) -> None:
    """Read the next ``num_bytes`` of ``reader`` (one tensor of ``dtype``) and raise
    TensorValidationError naming ``name`` if any element is NaN or +-inf."""
    if dtype not in _EXPONENT_MASKS:
        raise ValueError(f"dtype {dtype!r} is invalid; expected one of {sorted(_EXPONENT_MASKS)}")
    view, mask = _EXPONENT_MASKS[dtype]
    itemsize = np.dtype(view).itemsize
    chunk_bytes = _CHUNK_BYTES - _CHUNK_BYTES % itemsize
    done = 0
    while done < num_bytes:
        want = min(chunk_bytes, num_bytes - done)
        data = reader.read(want)
        if len(data) != want:
            raise CorruptArtifactError(
                f"tensor {name!r}: data truncated ({done + len(data)} bytes)"
            )
        bits = np.frombuffer(data, dtype=view)
        bad = np.flatnonzero((bits & mask) == mask)
        if bad.size:
            index = done // itemsize + int(bad[0])
            raise TensorValidationError(
                f"tensor {name!r}: element {index} is NaN or infinite; expected finite values"
            )
        done += want


class HashingReader:
    """Hashes every byte it hands out, so the digest covers exactly the bytes validated.

    NOTE: header, tensor data and digest come from one sequential pass over one open file; a
    file replaced or rewritten during validation cannot pair a digest with unchecked bytes.
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._sha256 = hashlib.sha256()

    def read(self, size: int, /) -> bytes:
        data = self._handle.read(size)
        self._sha256.update(data)
        return data

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()
