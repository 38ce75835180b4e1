"""The attacker's pathological adapters: valid PEFT directories, each hostile in one way.

- ``regex``: ``target_modules`` is a regex that matches q_proj and v_proj quickly but backtracks
  catastrophically on every other module path (its cost doubles per unit of ``regex_depth``);
- ``huge-weights``: every lora_B entry is ``HUGE_WEIGHT``, finite (so validation passes) but
  overflowing to inf within a layer: the adapter's logits are inf/NaN;
- ``huge-header``: an ordinary adapter whose safetensors header is padded to ``header_bytes``
  with millions of small ``__metadata__`` entries (a real adapter's header is tens of KB).
"""

from __future__ import annotations

import json
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.bench.adapters import write_random_adapter
from loraplex.bench.serve.attacker import PathologicalAdapter

HUGE_WEIGHT = 3e37  # float32 holds up to 3.4e38: finite on disk, inf after one matmul
_TARGETS = ("q_proj", "v_proj")
_RANK = 8
_LENGTH_BYTES = 8  # safetensors: little-endian header length, then the header


def catastrophic_regex(depth: int) -> str:
    """Fullmatches ``...q_proj`` / ``...v_proj`` at once; on any other module path the second
    branch tries every way of splitting up to ``depth`` characters between two identical
    alternatives (about 2**depth steps) before it fails on the ``!`` no path contains."""
    return rf".*\.(?:q_proj|v_proj)|(?:[\w.]|[\w.]){{0,{depth}}}!"


def write_pathological_adapters(
    base: BaseModelSpec, model_dir: Path, out: Path, *, header_bytes: int, regex_depth: int
) -> tuple[PathologicalAdapter, ...]:
    """The three hostile adapters under ``out`` (seeded, so every run uploads the same bytes)."""
    written = []
    for index, name in enumerate(("regex", "huge-weights", "huge-header")):
        path = write_random_adapter(
            base, model_dir, out / name, rank=_RANK, target_modules=_TARGETS, seed=index
        )
        written.append(PathologicalAdapter(name, path))
    _set_target_modules(out / "regex", catastrophic_regex(regex_depth))
    _fill_lora_b(out / "huge-weights" / WEIGHTS_FILE, HUGE_WEIGHT)
    pad_header(out / "huge-header" / WEIGHTS_FILE, header_bytes)
    return tuple(written)


def _set_target_modules(adapter_dir: Path, target_modules: str) -> None:
    path = adapter_dir / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    config["target_modules"] = target_modules
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def _fill_lora_b(weights: Path, value: float) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    for name, tensor in tensors.items():
        if ".lora_B." in name:
            tensor.fill_(value)
    save_file(tensors, str(weights))


def pad_header(weights: Path, header_bytes: int) -> None:
    """Rewrites ``weights`` with a header of exactly ``header_bytes`` bytes: the same tensors at
    the same data offsets, plus as many ``"m000000001":""`` metadata entries as fit."""
    raw = weights.read_bytes()
    length = int.from_bytes(raw[:_LENGTH_BYTES], "little")
    header = json.loads(raw[_LENGTH_BYTES : _LENGTH_BYTES + length])
    header.pop("__metadata__", None)
    tensors = json.dumps(header, separators=(",", ":")).encode("utf-8")
    opening = b'{"__metadata__":{'
    entry_bytes = len(b'"m000000000":"",')
    room = header_bytes - len(opening) - len(b"},") - (len(tensors) - 1)
    if room < 0:
        raise ValueError(
            f"header_bytes {header_bytes} is invalid; expected >= {header_bytes - room}"
        )
    entries = b",".join(b'"m%09d":""' % i for i in range(room // entry_bytes))
    body = opening + entries + b"}," + tensors[1:]
    body += b" " * (header_bytes - len(body))  # JSON allows trailing blanks (writers pad so)
    data = raw[_LENGTH_BYTES + length :]
    weights.write_bytes(len(body).to_bytes(_LENGTH_BYTES, "little") + body + data)
