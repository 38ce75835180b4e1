"""Where a merge's and an unmerge's time goes on a ``bench modes`` setup (mergestall).

The ``bench modes`` setup (random base of the preset, 16 random adapters, the hot one in slot
0), then ``rounds`` merge / unmerge pairs, each part timed per module and summed per pair:
``bound`` (the delta bound from the factors), ``base_largest`` (max |W|, read once per
module by the merger: its first merge only), ``backup`` (the host copy of W),
``addmm`` (W.float() + sBA, cast, written back), ``prepack`` (the packed copies, a no-op unless
the kernel packs), ``restore`` (the originals copied back) and ``unmerge_prepack``. Then the
staged path (model/staged_merge.py) when this tree has it: ``stage`` (the merged copies built
beside the live ones, packed), ``commit`` and ``unmerge`` (the swaps). Prints one JSON line of
median ms per part. Run niced, e.g. ``nice -n 19 python scripts/merge-split/probe.py large
bfloat16 5``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from loraplex.bench.modes.setup import ModesBenchConfig, Setup
from loraplex.model.merge import _delta_bound, _largest, linear_of, slot_weights


def _old_path(setup: Setup) -> dict[str, float]:
    weights = slot_weights(setup.pool, 0)
    model = setup.model
    parts = dict.fromkeys(
        ("bound", "base_largest", "backup", "addmm", "prepack", "restore", "unmerge_prepack"), 0.0
    )
    backup = {}
    with torch.no_grad():
        for module in weights.modules:
            weight = linear_of(model, module.layer, module.module).weight
            t0 = time.perf_counter()
            lora_a = module.lora_a.to(weight.device, torch.float32)
            lora_b = module.lora_b.to(weight.device, torch.float32)
            _delta_bound(lora_a, lora_b, module.scale)
            tb = time.perf_counter()
            _largest(weight)  # the merger reads it once per module (the first merge)
            t1 = time.perf_counter()
            parts["base_largest"] += t1 - tb
            t1 = time.perf_counter()
            backup[(module.layer, module.module)] = weight.detach().to("cpu", copy=True)
            t2 = time.perf_counter()
            merged = weight.float().addmm_(lora_b, lora_a, alpha=module.scale)
            weight.copy_(merged.to(weight.dtype))
            t3 = time.perf_counter()
            parts["bound"] += tb - t0
            parts["backup"] += t2 - t1
            parts["addmm"] += t3 - t2
        t0 = time.perf_counter()
        model.prepack()
        t1 = time.perf_counter()
        for (layer, name), original in backup.items():
            linear_of(model, layer, name).weight.copy_(original)
        t2 = time.perf_counter()
        model.prepack()
        t3 = time.perf_counter()
    parts["prepack"], parts["restore"], parts["unmerge_prepack"] = t1 - t0, t2 - t1, t3 - t2
    return parts


def _staged_path(setup: Setup) -> dict[str, float] | None:
    try:
        from loraplex.model.merge import WeightMerger
    except ImportError:
        return None
    merger = WeightMerger(setup.model)
    if not hasattr(merger, "stage"):
        return None
    weights = slot_weights(setup.pool, 0)
    t0 = time.perf_counter()
    staging = merger.stage(weights)
    while not staging.done:
        staging.advance(1e9)
    t1 = time.perf_counter()
    merger.commit(staging)
    t2 = time.perf_counter()
    merger.unmerge()
    t3 = time.perf_counter()
    return {"stage": t1 - t0, "commit": t2 - t1, "unmerge": t3 - t2}


def main(preset: str, dtype: str, rounds: int) -> None:
    config = ModesBenchConfig(preset=preset, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        old = [_old_path(setup) for _ in range(rounds)]
        staged = [_staged_path(setup) for _ in range(rounds)]
    out: dict[str, object] = {"preset": preset, "dtype": dtype, "rounds": rounds}
    out["kernel"] = setup.model.linear_kernel
    out["in_place_ms"] = {k: round(statistics.median(r[k] for r in old) * 1000, 2) for k in old[0]}
    if staged[0] is not None:
        rows = [r for r in staged if r is not None]
        out["staged_ms"] = {
            k: round(statistics.median(r[k] for r in rows) * 1000, 2) for k in rows[0]
        }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
