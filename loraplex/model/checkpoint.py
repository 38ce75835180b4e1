"""Load a Hugging Face checkpoint directory (config.json + safetensors) into a LlamaModel.

Strict: every parameter must come from the checkpoint with its exact shape, and every tensor in
the checkpoint must be used. A partial or mismatched load raises ``CheckpointError`` before the
model is returned, never a half-filled model. Sharded checkpoints
(``model.safetensors.index.json``) are read shard by shard. Pickle files are never opened.
Tensors stored in the parameter's own dtype are read straight into it (``safetensors_read``).
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import torch
from safetensors import safe_open

from loraplex.background import Background
from loraplex.errors import CheckpointError
from loraplex.model.config import ModelConfig
from loraplex.model.llama import LlamaModel
from loraplex.model.safetensors_read import (
    StoredTensor,
    direct_readable,
    read_into,
    stored_tensors,
)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Buffers some exporters saved that carry nothing the model needs (recomputed from config).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
_READ_THREADS = 2  # read_threads: at most


def checkpoint_files(model_dir: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc})") from exc
        files = {str(name): model_dir / str(shard) for name, shard in weight_map.items()}
        for shard in set(files.values()):
            if shard.parent != model_dir or not shard.is_file():
                raise CheckpointError(f"{index}: shard {shard.name!r} is not a file in {model_dir}")
        return _verify_index(files)
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(
            f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}; expected safetensors"
        )
    return {name: single for name in _keys(single)}


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except Exception as exc:  # safetensors raises its own untyped errors on bad headers
        raise CheckpointError(f"{path}: unreadable safetensors file ({exc})") from exc


def _verify_index(files: dict[str, Path]) -> dict[str, Path]:
    """The index must name exactly the tensors its shards hold."""
    for shard in set(files.values()):
        held = set(_keys(shard))
        claimed = {name for name, path in files.items() if path == shard}
        if held != claimed:
            extra = sorted(held ^ claimed)[:3]
            raise CheckpointError(f"{shard}: index and shard disagree on tensors, e.g. {extra}")
    return files


def load_checkpoint(
    model_dir: Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    linear_kernel: str = "auto",
    prepack: bool = True,
) -> LlamaModel:
    """Build the model for ``model_dir/config.json`` and fill it from the safetensors files
    (``linear_kernel``: ``LlamaModel``'s). With the "packed" kernel (what ``auto`` picks for
    float32 on a CPU) ``prepack`` makes the weights' packed copies here; False leaves that to
    the caller (``LlamaModel.prepack``; the layers run the dense weights until then)."""
    config = ModelConfig.from_dir(model_dir)
    target = torch.device(device)
    model = LlamaModel(config, dtype=dtype, device=target, linear_kernel=linear_kernel)
    files = checkpoint_files(model_dir)
    params = dict(model.named_parameters())
    names = {n for n in files if not n.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings:
        # Some exporters also write the tied head; the embedding is the head, so it is not read.
        names.discard("lm_head.weight")
    missing = sorted(set(params) - names)
    unexpected = sorted(names - set(params))
    if missing or unexpected:
        raise CheckpointError(
            f"{model_dir}: checkpoint does not match config.json: missing {missing[:5]} "
            f"({len(missing)}), unexpected {unexpected[:5]} ({len(unexpected)})"
        )
    by_file: dict[Path, list[str]] = {}
    for name in sorted(names):
        by_file.setdefault(files[name], []).append(name)
    with torch.no_grad():
        for path, file_names in sorted(by_file.items()):
            _load_file(model_dir, path, {name: params[name] for name in file_names})
        if prepack:
            model.prepack()
    return model.eval()


def read_threads() -> int:
    """Threads a load reads a file's tensors on: two where this process may run on two cores or
    more, else one. Most of a load's time is the first writes of the parameters' pages (huge
    pages the kernel zero-fills, ``model.buffers.weight_buffer``), which a second thread runs on
    a second core; the engine process loads before it serves, its other threads mostly idle."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return min(_READ_THREADS, cores)


def _read_direct(
    path: Path, tensors: list[tuple[StoredTensor, torch.Tensor]], threads: int
) -> None:
    """``read_into`` each (stored, target) pair, in file order: with ``threads`` > 1 the list is
    cut into that many runs of about equal bytes, each read in order on a thread of its own
    (this one reads the first) through its own handle of the file; what any raised is raised
    once all have ended."""
    runs = _runs_by_bytes(tensors, threads)
    readers = [Background(partial(_read_run, path, run), "loraplex-read") for run in runs[1:]]
    try:
        _read_run(path, runs[0] if runs else [])
    finally:
        for reader in readers:
            reader.wait()
    for reader in readers:
        reader.result()


def _read_run(path: Path, run: list[tuple[StoredTensor, torch.Tensor]]) -> None:
    if not run:
        return
    with path.open("rb", buffering=0) as handle:
        for entry, target in run:
            read_into(handle, entry, target)


def _runs_by_bytes(
    tensors: list[tuple[StoredTensor, torch.Tensor]], count: int
) -> list[list[tuple[StoredTensor, torch.Tensor]]]:
    """``tensors`` cut, in order, into at most ``count`` consecutive runs of about equal bytes
    (none empty)."""
    total = sum(entry.end - entry.begin for entry, _ in tensors)
    runs: list[list[tuple[StoredTensor, torch.Tensor]]] = [[]]
    done = 0
    for item in tensors:
        if runs[-1] and len(runs) < count and done >= total * len(runs) / count:
            runs.append([])
        runs[-1].append(item)
        done += item[0].end - item[0].begin
    return [run for run in runs if run]


def _load_file(model_dir: Path, path: Path, params: dict[str, torch.nn.Parameter]) -> None:
    """Fill ``params`` from the safetensors file ``path``: in file order straight into each
    parameter where its bytes are its value (``safetensors_read``, ``_read_direct``), else
    through ``get_tensor`` and a converting copy. Every tensor is checked before any is read."""
    stored = stored_tensors(path)
    converted = []
    direct: list[tuple[StoredTensor, torch.Tensor]] = []
    for name in sorted(params, key=lambda n: stored[n].begin if n in stored else -1):
        entry, param = stored.get(name), params[name]
        if entry is None:  # safetensors listed it a moment ago: the file changed since
            raise CheckpointError(f"{path}: tensor {name!r} is no longer in the file")
        if entry.shape != tuple(param.shape):
            raise CheckpointError(
                f"{model_dir}: tensor {name!r} has shape {entry.shape}; expected "
                f"{tuple(param.shape)}"
            )
        if direct_readable(entry, param):
            direct.append((entry, param))
        else:
            converted.append(name)
    _read_direct(path, direct, read_threads())
    if not converted:
        return
    with safe_open(str(path), framework="pt") as tensors:
        for name in converted:
            tensor = tensors.get_tensor(name)
            if not tensor.is_floating_point():
                raise CheckpointError(f"{model_dir}: tensor {name!r} has dtype {tensor.dtype}")
            params[name].copy_(tensor)
