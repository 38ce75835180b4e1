"""The single-revision trio's estimator with several block settings, one process (issue 28).

``bench modes``' setup (``--dtype``, ``--batch-size`` sequences all on the hot revision, the
hot revision merged): base, unmerged, merged and base again (the A/A control), timed by
``paired_rounds`` with each ``--blocks`` setting in turn (the list is run in the order given,
e.g. ``1,9,9,1``: ABBA over settings), ``--rounds`` rounds of samples at least
``--sample-ms`` long. Prints one JSON line per setting: the per-round paired ratios (median,
min, max) and the median step of each variant. Run under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/modes-single-paired/blocks.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from loraplex.bench.execution.timing import paired_rounds
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup, decode_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sample-ms", type=float, default=150.0)
    parser.add_argument("--blocks", default="1,9,9,1")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = ModesBenchConfig(dtype=args.dtype, batch_size=args.batch_size, preset=args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        step = decode_step(setup, [HOT] * args.batch_size)
        merged = setup.merge(HOT)
        for blocks in (int(b) for b in args.blocks.split(",")):
            timed = paired_rounds(
                {
                    "base": lambda: step(None),
                    "unmerged": lambda: step(setup.pool),
                    "merged": lambda: step(merged),
                    "base_again": lambda: step(None),
                },
                rounds=args.rounds,
                min_sample_s=args.sample_ms / 1000,
                blocks=blocks,
            )
            line = {
                "name": "modes-single-blocks",
                "config": {**vars(args), "threads": 1},
                "blocks": blocks,
                "calls_per_block": timed.calls,
                "base_again_over_base": timed.ratio("base_again", "base"),
                "merged_over_base": timed.ratio("merged", "base"),
                "merged_over_unmerged": timed.ratio("merged", "unmerged"),
                "step_ms": {k: v * 1e3 for k, v in timed.medians().items()},
            }
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
