"""Which ``AutoPolicy.emulated_mac_factor`` puts the probed steps on their fastest strategy, on
a CPU without native bfloat16 arithmetic (docs/modes.md, twentieth pass).

Reads ``probe.py`` JSON lines (one preset, bfloat16, run on such a CPU), rebuilds that preset's
``bench modes`` pool to get each probed step's :class:`StepShape` (``half_emulated`` forced on),
and prints, per factor (``--factors``, default 1,2,4,8,16,32), per step: the strategy ``auto``
would choose (``grouped_f32`` where it would take the float32 pass), the measured step time of
that choice over the fastest measured one (1.0: it picks the best; the float32 pass is read as
the probe's uncapped ``grouped_f32``, an approximation where a run is longer than the cap), and
the worst and geometric mean of those over the steps. One JSON line per factor; with
``--native`` one more (``"emulated_mac_factor": null``): the choice of the costs fitted on native
bfloat16 CPUs (``half_emulated`` off), i.e. what ``auto`` did on this CPU before the rule.

``python scripts/lora-strategy/fit_emulated.py small /tmp/before-small.jsonl`` (torch-only:
no timing, runs anywhere).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
from pathlib import Path

import torch

from loraplex.bench.modes.setup import ModesBenchConfig, Setup
from loraplex.ops import Strategy
from loraplex.ops.plan import FLOAT32_MAX_TOKENS, active_slot_tokens
from loraplex.ops.policy import AutoPolicy, StepShape


def step_tokens(name: str, slots: list[int | None], context: int) -> torch.Tensor:
    per_seq = context if name.startswith("prefill") else 1
    return torch.tensor([-1 if s is None else s for s in slots for _ in range(per_seq)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("preset")
    parser.add_argument("probe_jsonl")
    parser.add_argument("--factors", default="1,2,4,8,16,32")
    parser.add_argument("--native", action="store_true")
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.probe_jsonl).read_text().splitlines()]
    rows = [r for r in rows if r["preset"] == args.preset and r["dtype"] == "bfloat16"]
    cfg = ModesBenchConfig(preset=args.preset, dtype="bfloat16", batch_size=20)
    random.seed(cfg.seed)
    with tempfile.TemporaryDirectory() as tmp:
        layout = Setup(Path(tmp), cfg).pool.layout
        factors: list[int | None] = [int(f) for f in args.factors.split(",")]
        for factor in [*factors, None] if args.native else factors:
            policy = AutoPolicy() if factor is None else AutoPolicy(emulated_mac_factor=factor)
            out: dict[str, object] = {"preset": args.preset, "emulated_mac_factor": factor}
            ratios = []
            for row in rows:
                for name, step in row.items():
                    if not isinstance(step, dict):
                        continue
                    token_slots = step_tokens(name, step["slots"], cfg.context_tokens)
                    tokens = active_slot_tokens(token_slots, layout)
                    shape = StepShape.of(
                        int(token_slots.numel()),
                        tokens,
                        layout,
                        FLOAT32_MAX_TOKENS,
                        bfloat16_emulated=factor is not None,
                    )
                    choice = policy.choose(shape, layout.width)
                    label = choice.value
                    if choice is Strategy.GROUPED and policy.grouped_in_float32(
                        shape, layout.width
                    ):
                        label = "grouped_f32"
                    best = min(
                        step[v]["step_ms"] for v in ("masked", "grouped", "batched", "grouped_f32")
                    )
                    ratio = best / step[label]["step_ms"]
                    ratios.append(ratio)
                    out[f"{row['start_utc']}/{name}"] = [label, round(ratio, 3)]
            out["worst"] = round(min(ratios), 3)
            out["geomean"] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
            sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
