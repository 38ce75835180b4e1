"""The torch-free safetensors header reader: sizes are checked against the file, never trusted."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from loraplex.artifacts.safetensors_header import (
    MAX_HEADER_BYTES,
    check_length_prefix,
    read_safetensors_header,
)
from loraplex.errors import CorruptArtifactError


def write(path: Path, header: object, data: bytes, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    size = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", size) + raw + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_reads_a_file_written_by_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    save_file(
        {"b": np.ones((2, 3), dtype=np.float16), "a": np.zeros((4,), dtype=np.float32)},
        str(path),
        metadata={"format": "pt"},
    )
    header = read_safetensors_header(path)
    assert header.metadata == {"format": "pt"}
    assert {(e.name, e.dtype, e.shape, e.num_bytes) for e in header.entries} == {
        ("a", "F32", (4,), 16),
        ("b", "F16", (2, 3), 12),
    }
    assert [e.begin for e in header.entries] == sorted(e.begin for e in header.entries)
    raw = path.read_bytes()
    for e in header.entries:
        start = header.absolute_offset(e)
        expected = np.zeros(4, np.float32) if e.name == "a" else np.ones((2, 3), np.float16)
        assert raw[start : start + e.num_bytes] == expected.tobytes()


def test_zero_sized_tensor_and_empty_header(tmp_path: Path) -> None:
    header = read_safetensors_header(write(tmp_path / "e", {"z": entry("F32", [0, 3], 0, 0)}, b""))
    assert header.entries[0].shape == (0, 3)
    assert read_safetensors_header(write(tmp_path / "f", {}, b"")).entries == ()


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ([1, 2], b"", "expected an object"),
        ({"t": entry("I9", [1], 0, 1)}, b"\0", "unknown dtype"),
        ({"t": entry("F32", [-1], 0, 4)}, b"\0" * 4, "ints >= 0"),
        ({"t": entry("F32", [1.5], 0, 4)}, b"\0" * 4, "ints >= 0"),
        ({"t": entry("F32", [1] * 17, 0, 4)}, b"\0" * 4, "at most 16"),
        ({"t": entry("F32", [2], 0, 4)}, b"\0" * 4, "expected 8 for shape"),
        ({"t": entry("F32", [1], 4, 0)}, b"\0" * 4, "span -4 bytes"),
        ({"t": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "expected keys"),
        ({"t": {**entry("F32", [1], 0, 4), "x": 1}}, b"\0" * 4, "expected keys"),
        ({"t": entry("F32", [1], 0, 4)}, b"\0" * 3, "truncated"),
        ({"t": entry("F32", [1], 0, 4)}, b"\0" * 5, "trailing bytes"),
        ({"t": entry("F32", [1], 4, 8)}, b"\0" * 8, "leaves a gap"),
        (
            {"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)},
            b"\0" * 8,
            "overlaps",
        ),
        ({"t": entry("F32", [1], 0, 4)}, b"", "truncated"),
        ({"__metadata__": {"k": 1}}, b"", "__metadata__"),
        ({"t": entry("F32", [1 << 40, 1 << 40], 0, 1 << 82)}, b"\0" * 8, "truncated"),
    ],
)
def test_inconsistent_headers_are_rejected(
    tmp_path: Path, header: object, data: bytes, message: str
) -> None:
    with pytest.raises(CorruptArtifactError, match=message):
        read_safetensors_header(write(tmp_path / "bad", header, data))


def test_header_length_beyond_file_or_cap_is_rejected_before_reading(tmp_path: Path) -> None:
    path = write(tmp_path / "h", {}, b"", length=1 << 62)
    with pytest.raises(CorruptArtifactError, match="header length 4611686018427387904"):
        read_safetensors_header(path)
    with pytest.raises(CorruptArtifactError, match="header length"):
        read_safetensors_header(write(tmp_path / "h2", {}, b"", length=3))
    (tmp_path / "text").write_bytes(b"notsafetensors\n")  # what an operator may upload by mistake
    with pytest.raises(CorruptArtifactError, match="not a safetensors file") as caught:
        read_safetensors_header(tmp_path / "text")
    with pytest.raises(CorruptArtifactError, match="not a safetensors file") as prefix:
        check_length_prefix(b"notsafetensors\n"[:8], "upload part 'weights'")
    assert str(prefix.value).startswith("upload part 'weights': header length 8387222449782288238")
    assert "expected 2 up to the cap 1048576" in str(caught.value)
    assert MAX_HEADER_BYTES == 1 << 20


def test_too_short_not_json_duplicate_keys_and_deep_nesting(tmp_path: Path) -> None:
    (tmp_path / "short").write_bytes(b"\x01\x00")
    with pytest.raises(CorruptArtifactError, match="2 bytes; truncated"):
        read_safetensors_header(tmp_path / "short")
    (tmp_path / "nj").write_bytes(struct.pack("<Q", 4) + b"\xff{}x")
    with pytest.raises(CorruptArtifactError, match="not valid UTF-8 JSON"):
        read_safetensors_header(tmp_path / "nj")
    dup = b'{"__metadata__": {}, "__metadata__": {}}'
    (tmp_path / "dup").write_bytes(struct.pack("<Q", len(dup)) + dup)
    with pytest.raises(CorruptArtifactError, match="repeats a key"):
        read_safetensors_header(tmp_path / "dup")
    deep = b"[" * 100_000 + b"]" * 100_000
    (tmp_path / "deep").write_bytes(struct.pack("<Q", len(deep)) + deep)
    with pytest.raises(CorruptArtifactError):
        read_safetensors_header(tmp_path / "deep")
    with pytest.raises(CorruptArtifactError, match="not a regular file"):
        read_safetensors_header(tmp_path)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_corruption_only_raises_corrupt_artifact(
    tmp_path: Path, data: st.DataObject
) -> None:
    header = {"a": entry("F32", [2, 2], 0, 16), "b": entry("BF16", [3], 16, 22)}
    good = bytearray(struct.pack("<Q", 0) + json.dumps(header).encode() + bytes(range(22)))
    good[:8] = struct.pack("<Q", len(good) - 8 - 22)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(good) - 1))
        good[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    path = tmp_path / "fuzz"
    path.write_bytes(bytes(good[:cut]))
    try:
        header_read = read_safetensors_header(path)
    except CorruptArtifactError:
        return
    total = sum(e.num_bytes for e in header_read.entries)
    assert header_read.data_start + total == path.stat().st_size


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            struct.pack("<Q", 100),
            "8 bytes; truncated",
        ),  # only the length prefix: said so, not "2..0"
        (struct.pack("<Q", 0), "8 bytes; truncated"),
        (struct.pack("<Q", 2) + b"{", "9 bytes; truncated"),
        (
            struct.pack("<Q", 50) + b"{}",
            r"truncated: its header length 50 needs 58 bytes; the file has 10",
        ),
    ],
    ids=["prefix-only", "zero-length-prefix-only", "one-header-byte", "header-past-the-end"],
)
def test_a_file_too_short_for_its_header_says_it_is_truncated(
    tmp_path: Path, raw: bytes, message: str
) -> None:
    (tmp_path / "short").write_bytes(raw)
    with pytest.raises(CorruptArtifactError, match=message) as caught:
        read_safetensors_header(tmp_path / "short")
    assert "expected 2.." not in str(caught.value)
