#!/usr/bin/env python3
"""Each demo adapter's largest merged delta against the base weights: per module
``max |s B A| / max |W|`` (what ``model/merge.py``'s ``MAX_DELTA_RATIO`` bounds) and the
Frobenius ratio, the worst module of each revision::

    PYTHONPATH=$PWD python scripts/attacks/attack23/merge-ratios.py [.loraplex-assets/test-small]
"""

import sys
from pathlib import Path

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.demo.assets import load_demo_assets
from loraplex.model.adapter_weights import load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint
from loraplex.model.merge import linear_of

root = Path(sys.argv[1] if len(sys.argv) > 1 else ".loraplex-assets/test-small")
assets = load_demo_assets(root)
base = BaseModelSpec.from_dir(assets.base_model_dir)
model = load_checkpoint(assets.base_model_dir)
for a in assets.adapters:
    v = validate_adapter_dir(a.path, base, 128)
    w = load_adapter_weights(v, dtype=torch.float32)
    worst = worst_rms = 0.0
    for m in w.modules:
        W = linear_of(model, m.layer, m.module).weight.float()
        D = m.scale * (m.lora_b.float() @ m.lora_a.float())
        worst = max(worst, float(D.abs().max() / W.abs().max()))
        worst_rms = max(worst_rms, float(D.norm() / W.norm()))
    sys.stdout.write(f"{a.ref} max-ratio {worst:.4g} rms-ratio {worst_rms:.4g}\n")
