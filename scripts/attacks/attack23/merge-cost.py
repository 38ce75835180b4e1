#!/usr/bin/env python3
"""What the refusal check costs a merge: ``WeightMerger.merge`` of this tree against another
tree's (``--other``, e.g. a ``git archive`` of main), side by side in one process, ABBA rounds.

The other tree's ``loraplex/model/merge.py`` is loaded as a module of its own (its imports
resolve to this tree's ``loraplex``, so only ``merge.py`` differs). Each round times
``--repeats`` merges (each followed by an untimed unmerge) of one demo adapter into the demo
model per side, in the order A B B A; prints one JSON line per dtype: each side's median merge
in ms over all rounds, and the per-round ratio B / A (median, min, max)::

    PYTHONPATH=$PWD python scripts/attacks/attack23/merge-cost.py --other /tmp/main
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.demo.assets import load_demo_assets
from loraplex.model import merge as this_merge
from loraplex.model.adapter_weights import load_adapter_weights
from loraplex.model.checkpoint import load_checkpoint


def other_merge(root: Path):
    spec = importlib.util.spec_from_file_location("other_merge", root / "loraplex/model/merge.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["other_merge"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def timed(merger: object, weights: object, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        merger.merge(weights)  # type: ignore[attr-defined]
        out.append(time.perf_counter() - start)
        merger.unmerge()  # type: ignore[attr-defined]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--other", type=Path, required=True)
    parser.add_argument("--assets", type=Path, default=Path(".loraplex-assets/test-small"))
    parser.add_argument("--adapter", default="globex/summarize@r1")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    assets = load_demo_assets(args.assets)
    base = BaseModelSpec.from_dir(assets.base_model_dir)
    tenant_name, revision = args.adapter.split("@")
    tenant, name = tenant_name.split("/")
    path = assets.adapter(tenant, name, revision).path
    other = other_merge(args.other)
    for dtype in (torch.float32, torch.bfloat16):
        weights = load_adapter_weights(validate_adapter_dir(path, base, 128), dtype=dtype)
        model = load_checkpoint(assets.base_model_dir, dtype=dtype)
        a, b = other.WeightMerger(model), this_merge.WeightMerger(model)
        timed(a, weights, 3)
        timed(b, weights, 3)
        seen: dict[str, list[float]] = {"A": [], "B": []}
        ratios = []
        for _ in range(args.rounds):
            got = {"A": [], "B": []}
            for side in "ABBA":
                got[side] += timed(a if side == "A" else b, weights, args.repeats)
            ratios.append(statistics.median(got["B"]) / statistics.median(got["A"]))
            for side in "AB":
                seen[side] += got[side]
        line = {
            "name": "merge-cost",
            "dtype": str(dtype).removeprefix("torch."),
            "adapter": args.adapter,
            "modules": len(weights.modules),
            "a_median_ms": round(statistics.median(seen["A"]) * 1e3, 3),
            "b_median_ms": round(statistics.median(seen["B"]) * 1e3, 3),
            "ratio_b_over_a": {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            },
            "rounds": args.rounds,
            "repeats": args.repeats,
        }
        sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
