"""Tensors read straight from a safetensors file into existing parameters
(``model/safetensors_read.py``): the same bytes as safetensors' own reader, every header
refused that does not describe the file, and only same-dtype CPU targets taken."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loraplex.errors import CheckpointError
from loraplex.model.checkpoint import _read_direct, _runs_by_bytes, load_checkpoint, read_threads
from loraplex.model.safetensors_read import (
    StoredTensor,
    direct_readable,
    read_into,
    stored_tensors,
)


def write_raw(path: Path, header: object, data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_read_into_gives_safetensors_own_values(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7, dtype=torch.float64),
        "h": torch.randn(2, 4).bfloat16(),
        "e": torch.zeros(0, 4),
    }
    save_file(tensors, path)
    stored = stored_tensors(path)
    assert set(stored) == set(tensors)
    with path.open("rb", buffering=0) as handle:
        for name, value in tensors.items():
            target = torch.full_like(value, 7.0)
            assert direct_readable(stored[name], target)
            read_into(handle, stored[name], target)
            assert torch.equal(target, load_file(path)[name])


def test_only_same_dtype_same_shape_contiguous_targets_are_direct(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(4, 6), "i": torch.arange(6)}, path)
    stored = stored_tensors(path)
    assert direct_readable(stored["a"], torch.empty(4, 6))
    assert not direct_readable(stored["a"], torch.empty(4, 6, dtype=torch.bfloat16))
    assert not direct_readable(stored["a"], torch.empty(6, 4))
    assert not direct_readable(stored["a"], torch.empty(6, 4).t())  # not contiguous
    assert not direct_readable(stored["i"], torch.empty(6, dtype=torch.int64))  # not a float


@pytest.mark.parametrize(
    ("header", "data", "match"),
    [
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "truncated"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}}, b"\0" * 16, "truncated"),
        ({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, b"\0" * 16, "malformed"),
        ({"a": {"dtype": "F32", "shape": [4]}}, b"\0" * 16, "malformed"),
        ({"a": [1, 2]}, b"", "malformed"),
        ([1, 2], b"", "not an object"),
    ],
)
def test_headers_not_describing_the_file_are_refused(
    header: object, data: bytes, match: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.safetensors"
    write_raw(path, header, data)
    with pytest.raises(CheckpointError, match=match):
        stored_tensors(path)


def test_header_length_beyond_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(CheckpointError, match="header length"):
        stored_tensors(path)


def test_a_file_shorter_than_its_header_says_stops_the_read(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(64)}, path)
    stored = stored_tensors(path)["a"]
    with path.open("rb", buffering=0) as handle:
        path.write_bytes(path.read_bytes()[:-8])  # cut after the header was read
        with pytest.raises(CheckpointError, match="early"):
            read_into(handle, stored, torch.empty(64))


def test_bfloat16_checkpoint_loads_directly_into_a_bfloat16_model(
    tiny_model: Callable[..., Path],
) -> None:
    model_dir = tiny_model("llama")
    path = model_dir / "model.safetensors"
    save_file({k: v.bfloat16() for k, v in load_file(path).items()}, path)
    model = load_checkpoint(model_dir, dtype=torch.bfloat16)
    stored = load_file(path)
    for name, param in model.named_parameters():
        assert param.dtype == torch.bfloat16
        assert torch.equal(param, stored[name]), name


def _pairs(path: Path, targets: dict[str, torch.Tensor]) -> list[tuple[StoredTensor, torch.Tensor]]:
    stored = stored_tensors(path)
    return sorted(((stored[n], t) for n, t in targets.items()), key=lambda p: p[0].begin)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_file_read_on_several_threads_gives_the_same_values(tmp_path: Path, threads: int) -> None:
    """``checkpoint._read_direct``: the tensors cut into runs of about equal bytes in file
    order, each run read on a thread of its own: every tensor filled as safetensors reads it."""
    path = tmp_path / "t.safetensors"
    tensors = {f"t{i}": torch.randn(16 * (i + 1), 8) for i in range(7)}
    save_file(tensors, path)
    targets = {n: torch.full_like(v, 7.0) for n, v in tensors.items()}
    pairs = _pairs(path, targets)
    runs = _runs_by_bytes(pairs, threads)
    assert [p for run in runs for p in run] == pairs and len(runs) == threads
    sizes = [sum(e.end - e.begin for e, _ in run) for run in runs]
    assert max(sizes) - min(sizes) <= max(e.end - e.begin for e, _ in pairs)
    _read_direct(path, pairs, threads)
    for name, value in load_file(path).items():
        assert torch.equal(targets[name], value), name


def test_a_short_read_on_the_second_thread_is_raised(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(64), "b": torch.randn(64)}, path)
    pairs = _pairs(path, {"a": torch.empty(64), "b": torch.empty(64)})
    path.write_bytes(path.read_bytes()[:-8])  # the last tensor, read by the second thread, cut
    with pytest.raises(CheckpointError, match="early"):
        _read_direct(path, pairs, 2)


def test_a_load_reads_on_two_threads_where_two_cores_are_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert read_threads() == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert read_threads() == 1
