"""Load a Hugging Face checkpoint directory (config.json + safetensors) into a LlamaModel.

Strict: every parameter must come from the checkpoint with its exact shape, and every tensor in
the checkpoint must be used. A partial or mismatched load raises ``CheckpointError`` before the
model is returned, never a half-filled model. Sharded checkpoints
(``model.safetensors.index.json``) are read shard by shard. Pickle files are never opened.
Tensors stored in the parameter's own dtype are read straight into it (``safetensors_read``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from loraplex.errors import CheckpointError
from loraplex.model.config import ModelConfig
from loraplex.model.llama import LlamaModel
from loraplex.model.safetensors_read import direct_readable, read_into, stored_tensors

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Buffers some exporters saved that carry nothing the model needs (recomputed from config).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


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


def _load_file(model_dir: Path, path: Path, params: dict[str, torch.nn.Parameter]) -> None:
    """Fill ``params`` from the safetensors file ``path``: in file order straight into each
    parameter where its bytes are its value (``safetensors_read``), else through
    ``get_tensor`` and a converting copy."""
    stored = stored_tensors(path)
    converted = []
    with path.open("rb", buffering=0) as handle:
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
                read_into(handle, entry, param)
            else:
                converted.append(name)
    if not converted:
        return
    with safe_open(str(path), framework="pt") as tensors:
        for name in converted:
            tensor = tensors.get_tensor(name)
            if not tensor.is_floating_point():
                raise CheckpointError(f"{model_dir}: tensor {name!r} has dtype {tensor.dtype}")
            params[name].copy_(tensor)
