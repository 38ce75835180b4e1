"""``bench modes``' single-revision trio and transitions alone (issue 28), for a preset whose
whole ``bench modes`` run does not fit a 10-minute benchmark lock (``large``).

The same code as ``bench modes``: ``transition_ms`` (``--num-transitions`` merge / unmerge
pairs of the hot revision) and ``single_figures`` (base, unmerged, merged, base again and
unmerged again in ``--single-rounds`` rounds of ``--single-blocks`` settled blocks, samples at
least ``--sample-ms`` long) on a random model of ``--preset``'s shapes with the 16 random
adapters. Prints one JSON line with the keys ``bench modes`` reports for them. Run under the
benchmark lock, e.g. ``flock /work/bench.lock nice -n -5 python
scripts/modes-single-paired/trio.py --preset large``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from loraplex.bench.modes.figures import pct, ratio, single_figures, transition_ms
from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="large")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--context-tokens", type=int, default=32)
    parser.add_argument("--num-transitions", type=int, default=10)
    parser.add_argument("--single-rounds", type=int, default=15)
    parser.add_argument("--sample-ms", type=float, default=150.0)
    parser.add_argument("--single-blocks", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = ModesBenchConfig(
        preset=args.preset,
        dtype=args.dtype,
        batch_size=args.batch_size,
        context_tokens=args.context_tokens,
        num_transitions=args.num_transitions,
        single_rounds=args.single_rounds,
        sample_ms=args.sample_ms,
        single_blocks=args.single_blocks,
    )
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        merges, unmerges = transition_ms(setup)
        merged = setup.merge(HOT)
        try:
            tps, paired = single_figures(setup, merged)
        finally:
            setup.unmerge()
    line = {
        "name": "modes-single-trio",
        "config": {**vars(args), "threads": 1},
        "metrics": {
            "single_merged_over_base": ratio(tps["merged"], tps["base"]),
            "single_merged_over_unmerged": ratio(tps["merged"], tps["unmerged"]),
            "unmerged_lora_overhead": ratio(tps["base"], tps["unmerged"]),
            "single_tokens_per_s": tps,
            "single_paired": paired,
            "mode_transition_ms_p50": pct(merges + unmerges, 0.5),
            "mode_transition_ms_p99": pct(merges + unmerges, 0.99),
            "merge_ms_p50": pct(merges, 0.5),
            "unmerge_ms_p50": pct(unmerges, 0.5),
        },
    }
    sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
