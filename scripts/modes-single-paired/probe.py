"""Single-revision merged / base: what separates the two (issue 28; docs/modes.md, ninth pass).

``bench modes``' ``single`` scenario runs "base" and "merged" on the same merged weights: base
passes no LoRA applier, merged passes the ``MergedLoraApplier``, whose ``prepare`` on an
all-merged batch returns a NONE batch, so the forward skips LoRA. This probe times, on that
setup (``--dtype``, ``--batch-size`` sequences all on the hot revision):

- ``prepare_us``: ``MergedLoraApplier.prepare`` alone on the step's token slots (median of
  ``--prepare-calls`` calls, 5 repeats) and, for scale, ``step_ms``: one decode step;
- ``paired``: base, merged (and unmerged) decode steps in ``--rounds`` ABBA rounds, each sample
  at least ``--sample-ms`` long (``paired_rounds``), the per-round ratios summarised.

Prints one JSON line. Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/modes-single-paired/probe.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from loraplex.bench.execution.timing import paired_rounds
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup, decode_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--sample-ms", type=float, default=150.0)
    parser.add_argument("--prepare-calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = ModesBenchConfig(dtype=args.dtype, batch_size=args.batch_size)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        setup = Setup(Path(tmp), config)
        slots: list[int | None] = [HOT] * args.batch_size
        step = decode_step(setup, slots)
        merged = setup.merge(HOT)
        token_slots = torch.tensor([HOT] * args.batch_size)
        prepare_us = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(args.prepare_calls):
                merged.prepare(token_slots)
            prepare_us.append((time.perf_counter() - start) / args.prepare_calls * 1e6)
        assert merged.prepare(token_slots).adds_nothing
        timed = paired_rounds(
            {
                "base": lambda: step(None),
                "merged": lambda: step(merged),
                "unmerged": lambda: step(setup.pool),
            },
            rounds=args.rounds,
            min_sample_s=args.sample_ms / 1000,
        )
        medians = timed.medians()
    sys.stdout.write(
        json.dumps(
            {
                "name": "modes-single-paired",
                "config": {**vars(args), "threads": 1},
                "prepare_us": statistics.median(prepare_us),
                "prepare_us_all": prepare_us,
                "step_ms": {k: v * 1e3 for k, v in medians.items()},
                "calls_per_sample": timed.calls,
                "merged_over_base": timed.ratio("merged", "base"),
                "merged_over_unmerged": timed.ratio("merged", "unmerged"),
                "base_over_unmerged": timed.ratio("base", "unmerged"),
                "ratio_of_medians_merged_over_base": medians["base"] / medians["merged"],
            }
        )
        + "\n"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
