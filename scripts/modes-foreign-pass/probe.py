"""Where a merged decode step's LoRA time goes (issue 28; docs/modes.md, sixth pass).

On ``bench modes``' setup (a random model of a preset's shapes, 16 adapters of ranks 8-64, the
hot one merged), one 80 %-skewed decode step of ``--batch-size`` sequences:

- ``modules``: the LoRA work of every (layer, module) of the step, per formulation, timed on the
  module inputs one real forward recorded (interleaved, ABBA, one clock): the unmerged op, the
  merged op as gathered (before 2026-12-04) and in place (after), and the per-token formulation
  with the negative slot appended (``[A_j; A_h]``, ``[s_j B_j, -s_h B_h]`` per token, one bmm
  pair for every foreign token) gathered every step, and the same with its weights gathered
  once (the floor of any cache of per-step plans);
- ``steps``: whole decode steps (base, unmerged, merged gathered, merged in place) over
  ``--seeds`` draws of the foreign tokens;
- ``rows_read``: arena rows each formulation's matmuls read per module.

Prints one JSON line. Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/modes-foreign-pass/probe.py``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from loraplex.bench.execution.timing import interleaved_medians
from loraplex.bench.modes.figures import skewed_slots
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup, decode_step
from loraplex.model.merge import MergedLoraApplier
from loraplex.ops import LoraBatch, ModuleLoraWeights
from loraplex.ops.merged_op import FusedMergedBatch
from loraplex.ops.plan import segments_of

Call = tuple[int, str, torch.Tensor, torch.Tensor]  # layer, module, x, out of one module


class Recorder:
    """The pool, recording every module's input and output of one forward."""

    def __init__(self, setup: Setup) -> None:
        self.pool, self.calls = setup.pool, list[Call]()

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        return self.pool.prepare(token_slots)

    def apply(
        self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor, batch: LoraBatch
    ) -> torch.Tensor:
        with torch.inference_mode(False):
            self.calls.append((layer, module, x.clone(), out.clone()))
        return self.pool.apply(layer, module, x, out, batch)


class Gathered(MergedLoraApplier):
    """The merged op as before 2026-12-04: grouped runs always over gathered, sorted tokens."""

    def prepare(self, token_slots: torch.Tensor) -> LoraBatch:
        plan = super().prepare(token_slots)
        if not isinstance(plan, FusedMergedBatch) or plan.order is not None:
            return plan
        foreign = plan.foreign if plan.foreign is not None else torch.arange(0)
        order = foreign[torch.argsort(token_slots[foreign], stable=True)]
        segments = segments_of(token_slots[order], plan.active_bits)
        return FusedMergedBatch(
            plan.token_slots,
            plan.num_tokens,
            plan.strategy,
            active_bits=plan.active_bits,
            segments=segments,
            order=order,
            active_tables=plan.active_tables,
            foreign=order,
        )


def per_token_pairs(
    weights: ModuleLoraWeights, negative: ModuleLoraWeights, slots: list[int], rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per foreign token ``[A_j; A_h]`` gathered (A transposed), ``[B_j; B_h]`` and the row
    scales (``s_j``, then ``-s_h``; 0 on padding rows): ``[k, d_in, R]``, ``[k, R, d_out]``,
    ``[k, 1, R]`` with ``R = rows + the merged rank``."""
    merged = negative.slots[0]
    index, scales = [], []
    for slot in slots:
        own = weights.slots[slot]
        index.append([own.start + min(i, max(own.rank - 1, 0)) for i in range(rows)])
        scales.append([own.scale if i < own.rank else 0.0 for i in range(rows)])
    flat = torch.tensor(index).flatten()
    k = len(slots)
    span = slice(merged.start, merged.start + merged.rank)
    lora_a = torch.cat(
        [
            weights.lora_a.index_select(0, flat).view(k, rows, -1),
            negative.lora_a[span].expand(k, -1, -1),
        ],
        1,
    )
    lora_b = torch.cat(
        [
            weights.lora_b.index_select(0, flat).view(k, rows, -1),
            negative.lora_b[span].expand(k, -1, -1),
        ],
        1,
    )
    row_scales = torch.tensor([s + [merged.scale] * merged.rank for s in scales])
    return lora_a.transpose(1, 2), lora_b, row_scales.unsqueeze(1).to(lora_a.dtype)


def module_variants(
    setup: Setup, calls: list[Call], token_slots: torch.Tensor
) -> tuple[dict[str, Callable[[], object]], dict[str, int]]:
    """The per-module formulations over every recorded module, and the rows each reads."""
    pool, negative = setup.pool, setup.negative
    merged, gathered = MergedLoraApplier(pool, HOT, negative), Gathered(pool, HOT, negative)
    plans = {"unmerged": pool.prepare(token_slots)}
    plans["merged_in_place"] = merged.prepare(token_slots)
    plans["merged_gathered"] = gathered.prepare(token_slots)
    foreign = torch.nonzero(token_slots != HOT).flatten()
    slots = token_slots[foreign].tolist()
    layout = pool.layout
    rows = max(layout.slot_rows[s] for s in slots)
    views = [
        (pool.module_weights(layer, m), negative.module_weights(layer, m), x, out)
        for layer, m, x, out in calls
    ]
    cached = [per_token_pairs(w, n, slots, rows) for w, n, _, _ in views]

    def applier(name: str, lora: MergedLoraApplier | None) -> Callable[[], object]:
        def run() -> None:
            for layer, module, x, out in calls:
                if lora is None:
                    pool.apply(layer, module, x, out, plans[name])
                else:
                    lora.apply(layer, module, x, out, plans[name])

        return run

    def per_token(gather: bool) -> Callable[[], object]:
        def run() -> None:
            for (w, n, x, out), pairs in zip(views, cached, strict=True):
                lora_a, lora_b, scales = per_token_pairs(w, n, slots, rows) if gather else pairs
                hidden = torch.bmm(x.index_select(0, foreign).unsqueeze(1), lora_a)
                hidden.mul_(scales)
                hidden.masked_fill_(scales == 0, 0.0)
                out.index_add_(0, foreign, torch.bmm(hidden, lora_b).squeeze(1))

        return run

    distinct = sorted(set(slots))
    foreign_rows = sum(layout.slot_rows[s] for s in distinct)
    merged_rows = layout.slot_rows[HOT]
    variants = {
        "unmerged": applier("unmerged", None),
        "merged_gathered": applier("merged_gathered", gathered),
        "merged_in_place": applier("merged_in_place", merged),
        "per_token_gathered_each_step": per_token(True),
        "per_token_gathered_once": per_token(False),
    }
    rows_read = {
        "unmerged": foreign_rows + merged_rows,
        "merged": foreign_rows + merged_rows,
        "per_token": len(slots) * (rows + merged_rows),
    }
    return variants, rows_read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = ModesBenchConfig(preset=args.preset, dtype=args.dtype, batch_size=args.batch_size)
    setup = Setup(Path(tempfile.mkdtemp()), config)
    slots = skewed_slots(random.Random(0), args.batch_size, 0.8)
    recorder = Recorder(setup)
    step = decode_step(setup, slots)
    step(recorder)  # type: ignore[arg-type]
    token_slots = torch.tensor([-1 if s is None else s for s in slots])
    setup.merge(HOT)
    with torch.inference_mode():
        variants, rows_read = module_variants(setup, recorder.calls, token_slots)
        modules = interleaved_medians(variants, rounds=args.rounds, calls_per_round=5)
        steps = whole_steps(setup, args)
    per_module = {name: s * 1e6 / len(recorder.calls) for name, s in modules.items()}
    sys.stdout.write(
        json.dumps(
            {
                "name": "modes-foreign-pass",
                "config": vars(args),
                "foreign_slots": [s for s in slots if s != HOT],
                "modules_per_step": len(recorder.calls),
                "module_us": per_module,
                "rows_read_per_module": rows_read,
                "steps": steps,
            }
        )
        + "\n"
    )


def whole_steps(setup: Setup, args: argparse.Namespace) -> dict[str, object]:
    """Whole decode steps per seed (ms) and the median ratios over seeds."""
    merged = MergedLoraApplier(setup.pool, HOT, setup.negative)
    gathered = Gathered(setup.pool, HOT, setup.negative)
    appliers = {"base": None, "unmerged": setup.pool, "merged_gathered": gathered}
    appliers["merged_in_place"] = merged
    rows = []
    for seed in range(args.seeds):
        step = decode_step(setup, skewed_slots(random.Random(seed), args.batch_size, 0.8))
        fns = {name: (lambda lora=lora, step=step: step(lora)) for name, lora in appliers.items()}
        medians = interleaved_medians(fns, rounds=args.rounds, calls_per_round=5)
        rows.append({name: s * 1e3 for name, s in medians.items()})

    def ratio(a: str, b: str) -> float:
        return statistics.median(row[a] / row[b] for row in rows)

    return {
        "ms": rows,
        "median_unmerged_over_merged_in_place": ratio("unmerged", "merged_in_place"),
        "median_unmerged_over_merged_gathered": ratio("unmerged", "merged_gathered"),
        "median_gathered_over_in_place": ratio("merged_gathered", "merged_in_place"),
        "median_unmerged_over_base": ratio("unmerged", "base"),
    }


if __name__ == "__main__":
    main()
