#!/usr/bin/env python3
"""Hostile adapter folders against ``validate_adapter_dir``, and links against ``staged_import``.

Each case is a copy of the demo's ``acme/support@r1`` with one thing made hostile (a safetensors
header bomb, absurd shapes or offsets, a dtype trick, an ``adapter_config.json`` field out of
range, a pattern trick); prints the time each took and the error it raised (``ACCEPTED`` if
none), then the answers of ``staged_import`` (registration by server path) to a symlinked file,
a hard-linked file, a symlinked folder, ``..`` and an absolute path, and the process's peak RSS::

    PYTHONPATH=$PWD python scripts/attacks/attack23/artifact-probe.py
"""

import json
import os
import resource
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.demo.assets import load_demo_assets
from loraplex.registry.imports import staged_import

assets = load_demo_assets(Path(".loraplex-assets/test-small"))
base = BaseModelSpec.from_dir(assets.base_model_dir)
good = assets.adapter("acme", "support", "r1").path
root = Path(tempfile.mkdtemp(prefix="a23art-"))
cfg0 = json.loads((good / "adapter_config.json").read_text())


def mk(name, cfg=None, weights=None, raw_cfg=None):
    d = root / name
    shutil.copytree(good, d)
    if cfg is not None:
        (d / "adapter_config.json").write_text(json.dumps({**cfg0, **cfg}))
    if raw_cfg is not None:
        (d / "adapter_config.json").write_text(raw_cfg)
    if weights is not None:
        (d / "adapter_model.safetensors").write_bytes(weights)
    return d


def st(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


T = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
cases = {
    "header-len-2^63": mk("h1", weights=struct.pack("<Q", 2**63) + b"{}"),
    "header-len-1MiB-claimed-short-file": mk("h2", weights=struct.pack("<Q", 1 << 20) + b"{}"),
    "shape-2^62": mk(
        "h3",
        weights=st(
            {T: {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 16]}}, b"\0" * 16
        ),
    ),
    "shape-4300-digit-int": mk(
        "h3b",
        weights=st({T: {"dtype": "F32", "shape": [10**4000], "data_offsets": [0, 4]}}, b"\0" * 4),
    ),
    "overlap-offsets": mk(
        "h4",
        weights=st(
            {
                T: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                T.replace("q_proj", "k_proj"): {
                    "dtype": "F32",
                    "shape": [2],
                    "data_offsets": [4, 12],
                },
            },
            b"\0" * 12,
        ),
    ),
    "offsets-past-end": mk(
        "h5", weights=st({T: {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    ),
    "dtype-F8": mk(
        "h6", weights=st({T: {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4)
    ),
    "many-tiny-tensors-1MiB": mk(
        "h7",
        weights=st(
            {f"t{i}": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for i in range(24000)}
        ),
    ),
    "r-2^31": mk("c1", cfg={"r": 2**31}),
    "r-0": mk("c2", cfg={"r": 0}),
    "r-negative": mk("c3", cfg={"r": -8}),
    "alpha-NaN-literal": mk("c4", raw_cfg=json.dumps({**cfg0, "lora_alpha": float("nan")})),
    "alpha-1e400": mk(
        "c5",
        raw_cfg=json.dumps({**cfg0, "lora_alpha": 7}).replace(
            '"lora_alpha": 7', '"lora_alpha": 1e400'
        ),
    ),
    "alpha-0": mk("c6", cfg={"lora_alpha": 0}),
    "alpha-negative": mk("c7", cfg={"lora_alpha": -16}),
    "target-module-missing": mk("c8", cfg={"target_modules": ["lm_head_x"]}),
    "target-embed": mk("c8b", cfg={"target_modules": ["embed_tokens"]}),
    "layers_to_transform-99": mk("c9", cfg={"layers_to_transform": [99]}),
    "layers_to_transform-negative": mk("c9b", cfg={"layers_to_transform": [-1]}),
    "rank_pattern-huge": mk("c10", cfg={"rank_pattern": {"q_proj": 10**9}}),
    "rank_pattern-redos": mk("c11", cfg={"rank_pattern": {"(a+)+b": 4}}),
    "alpha_pattern-negative": mk("c12", cfg={"alpha_pattern": {"q_proj": -1}}),
    "rank_pattern-shape-mismatch": mk("c13", cfg={"rank_pattern": {"q_proj": 2}}),
    "config-not-object": mk("c14", raw_cfg="[1,2,3]"),
    "config-deep-nesting": mk("c15", raw_cfg='{"x":' * 100000 + "1" + "}" * 100000),
}
for name, d in cases.items():
    t0 = time.perf_counter()
    try:
        validate_adapter_dir(d, base, 64)
        out = "ACCEPTED"
    except Exception as e:
        out = f"{type(e).__name__}: {str(e).replace(str(root), '<dir>')[:170]}"
    sys.stdout.write(f"{name:36s} {time.perf_counter() - t0:7.3f}s {out}\n")
# links through the import path
imp = root / "imports"
imp.mkdir()
(imp / "a").mkdir()
shutil.copy(good / "adapter_config.json", imp / "a")
os.symlink(good / "adapter_model.safetensors", imp / "a" / "adapter_model.safetensors")
shutil.copytree(good, imp / "b")
os.link(imp / "b" / "adapter_model.safetensors", root / "hard")
os.symlink(good, imp / "c")
for rel in ("a", "b", "c", "../imports/a", "/etc"):
    try:
        with staged_import(imp, rel) as p:
            out = "STAGED"
    except Exception as e:
        out = f"{type(e).__name__}: {str(e)[:150]}"
    sys.stdout.write(f"import {rel:30s} {out}\n")
sys.stdout.write(f"maxrss_mb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}\n")
shutil.rmtree(root)
