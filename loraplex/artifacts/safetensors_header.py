"""A torch-free safetensors header reader that trusts nothing the file claims.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data section. The JSON
maps tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to
the data section) plus an optional ``"__metadata__"`` string map.

Every size is checked against the real file size before anything depends on it: the header
length is capped, each tensor's byte span must equal ``prod(shape) * itemsize`` (Python ints, no
overflow), and the spans must tile the data section exactly, in order, with no gap, overlap or
trailing bytes. So a header claiming huge tensors fails on arithmetic and is never allocated.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loraplex.errors import CorruptArtifactError

# A real adapter's header is tens of KiB (~150 bytes per tensor: 1,764 tensors for every module
# of a 126-layer model is ~260 KiB). Checked on the length prefix, before the header is read, so
# a hostile file costs 8 bytes of I/O, not a 100 MB allocation and JSON parse.
MAX_HEADER_BYTES = 1 << 20
# Bounds the size arithmetic on hostile shapes; real tensors have a handful of dimensions.
MAX_DIMS = 16
_LENGTH_BYTES = 8
_METADATA_KEY = "__metadata__"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})

# safetensors dtype code -> bytes per element (sub-byte float formats are not accepted).
DTYPE_ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


@dataclass(frozen=True)
class TensorHeaderEntry:
    """One tensor as the header describes it, after every consistency check passed."""

    name: str  # tensor name
    dtype: str  # safetensors dtype code, e.g. "F32", "BF16"
    shape: tuple[int, ...]  # dimensions, each >= 0
    begin: int  # first byte, relative to the data section
    end: int  # one past the last byte, relative to the data section

    @property
    def num_bytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated safetensors header: entries in file order and where the data starts."""

    path: Path  # the file it was read from
    file_bytes: int  # file size when read
    data_start: int  # absolute offset of the data section (8 + header length)
    entries: tuple[TensorHeaderEntry, ...]  # sorted by begin offset; they tile the data section
    metadata: dict[str, str]  # the "__metadata__" map (empty when absent)

    def absolute_offset(self, entry: TensorHeaderEntry) -> int:
        """Absolute file offset of an entry's first byte."""
        return self.data_start + entry.begin


class ByteReader(Protocol):
    """Anything with ``read(size) -> bytes`` positioned where reading should start."""

    def read(self, size: int, /) -> bytes: ...


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Read and check the header of ``path``; CorruptArtifactError on any inconsistency."""
    if not path.is_file():
        raise CorruptArtifactError(f"{path}: not a regular file")
    with path.open("rb") as handle:
        return parse_safetensors_header(handle, path, os.fstat(handle.fileno()).st_size)


_MIN_FILE_BYTES = _LENGTH_BYTES + 2  # the length prefix and the shortest header, "{}"
LENGTH_PREFIX_BYTES = _LENGTH_BYTES  # the header length: a little-endian u64 opening the file
# What a length out of range most often means: a text, pickle or truncated file under the name
# (a new operator read "header length 8387222449782288238" and no more).
NOT_SAFETENSORS = " (its first 8 bytes, read as a little-endian length): not a safetensors file?"


def check_length_prefix(prefix: bytes, where: str) -> None:
    """CorruptArtifactError when the first 8 bytes of a safetensors file declare a header over
    MAX_HEADER_BYTES (an upload is refused on them, before the rest of the file is read)."""
    header_len = int.from_bytes(prefix[:_LENGTH_BYTES], "little")
    if header_len < 2 or header_len > MAX_HEADER_BYTES:
        raise CorruptArtifactError(
            f"{where}: header length {header_len}; expected 2 up to the cap {MAX_HEADER_BYTES}"
            f"{NOT_SAFETENSORS}"
        )


def parse_safetensors_header(reader: ByteReader, path: Path, file_bytes: int) -> SafetensorsHeader:
    """Read the header from the start of ``reader`` (a file of ``file_bytes`` bytes) and check it.

    Reads exactly the length prefix and the header, leaving ``reader`` at the data section, so a
    caller can go on to read (and hash) the data from the same open file.
    """
    if file_bytes < _MIN_FILE_BYTES:
        raise CorruptArtifactError(
            f"{path}: {file_bytes} bytes; truncated: a safetensors file has at least "
            f"{_MIN_FILE_BYTES} (an {_LENGTH_BYTES}-byte header length, then a header of 2 or more)"
        )
    header_len = int.from_bytes(reader.read(_LENGTH_BYTES), "little")
    if header_len < 2 or header_len > MAX_HEADER_BYTES:
        raise CorruptArtifactError(
            f"{path}: header length {header_len}; expected 2 up to the cap {MAX_HEADER_BYTES}"
            f"{NOT_SAFETENSORS}"
        )
    if header_len > file_bytes - _LENGTH_BYTES:
        raise CorruptArtifactError(
            f"{path}: truncated: its header length {header_len} needs "
            f"{_LENGTH_BYTES + header_len} bytes; the file has {file_bytes}"
        )
    raw = reader.read(header_len)
    if len(raw) != header_len:
        raise CorruptArtifactError(f"{path}: header truncated ({len(raw)} of {header_len} bytes)")
    data_start = _LENGTH_BYTES + header_len
    decoded = _decode_json(path, raw)
    metadata = _metadata(path, decoded.pop(_METADATA_KEY, None))
    entries = [_entry(path, name, value) for name, value in decoded.items()]
    entries.sort(key=lambda entry: (entry.begin, entry.end))
    _check_tiling(path, entries, file_bytes - data_start)
    return SafetensorsHeader(path, file_bytes, data_start, tuple(entries), metadata)


def _decode_json(path: Path, raw: bytes) -> dict[str, object]:
    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result = dict(pairs)
        if len(result) != len(pairs):
            raise CorruptArtifactError(f"{path}: header JSON repeats a key")
        return result

    try:
        decoded = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as exc:  # ValueError covers decode and int-size errors
        raise CorruptArtifactError(f"{path}: header is not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(decoded, dict):
        raise CorruptArtifactError(
            f"{path}: header is a JSON {type(decoded).__name__}; expected an object"
        )
    return decoded


def _metadata(path: Path, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise CorruptArtifactError(f"{path}: {_METADATA_KEY} must map strings to strings")
    return value


def _entry(path: Path, name: str, value: object) -> TensorHeaderEntry:
    if not isinstance(value, dict) or set(value) != _ENTRY_KEYS:
        raise CorruptArtifactError(
            f"{path}: tensor {name!r} entry is {value!r:.200}; expected keys {sorted(_ENTRY_KEYS)}"
        )
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_ITEMSIZE:
        raise CorruptArtifactError(f"{path}: tensor {name!r} has unknown dtype {dtype!r:.50}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(map(_is_count, shape)):
        raise CorruptArtifactError(
            f"{path}: tensor {name!r} shape {shape!r:.200}; expected a list of at most "
            f"{MAX_DIMS} ints >= 0"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        raise CorruptArtifactError(
            f"{path}: tensor {name!r} data_offsets {offsets!r:.200}; expected [begin, end] ints"
        )
    begin, end = offsets
    expected = math.prod(shape) * DTYPE_ITEMSIZE[dtype]
    if end < begin or end - begin != expected:
        raise CorruptArtifactError(
            f"{path}: tensor {name!r} data_offsets [{begin}, {end}] span {end - begin} bytes; "
            f"expected {expected} for shape {shape} {dtype}"
        )
    return TensorHeaderEntry(name, dtype, tuple(shape), begin, end)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_tiling(path: Path, entries: list[TensorHeaderEntry], data_bytes: int) -> None:
    """Spans must cover ``[0, data_bytes)`` exactly once, in order."""
    position = 0
    for entry in entries:
        if entry.begin != position:
            problem = "overlaps the previous tensor" if entry.begin < position else "leaves a gap"
            raise CorruptArtifactError(
                f"{path}: tensor {entry.name!r} starts at {entry.begin}, expected {position}: "
                f"{problem}"
            )
        position = entry.end
    if position != data_bytes:
        state = "truncated" if position > data_bytes else "has trailing bytes"
        raise CorruptArtifactError(
            f"{path}: tensors claim {position} data bytes but the file holds {data_bytes}: "
            f"data section {state}"
        )
