"""``calibrate_busy``'s busy-load ratio under several ``BusyMix``es, alternated on one demo server
(issue 30, SIMTAIL): does the calibration's ``load_busy_scale`` depend on what runs beside the load?

A fresh ``self_target`` (as ``sim calibrate --self`` and ``bench sim``'s in-run calibration
start it: ranks 8-64, both target sets, 2 copies each); then ``--rounds`` rounds, each running
``busy_samples`` (one repeat: the lowest- and highest-rank adapter of each target set) once per
mix, in turn. Prints one JSON line per mix and round (its ratios) and, per mix, the median over
every round's ratios.

    flock /work/bench.lock nice -n -5 python scripts/sim-timeline/busy_mixes.py --rounds 3 \
        [--out r.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from loraplex.bench.sim.calibrate_busy import LIGHT_MIX, TRACE_MIX, BusyMix, busy_samples
from loraplex.bench.sim.calibrate_run import CalibrateConfig, slots_for_mixes
from loraplex.bench.sim.calibrate_target import self_target

MIXES = {
    "light": LIGHT_MIX,
    "trace": TRACE_MIX,
    "heavy": BusyMix(decoding=4, arrivals=8, arrival_gap_s=0.002),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--asset-dir", type=Path, default=Path(".loraplex-assets"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    config = CalibrateConfig(repeats=1)
    slots = max(4, slots_for_mixes(config))
    ratios: dict[str, list[float]] = {name: [] for name in MIXES}
    rows = []
    sets = ("attn", "all")
    with self_target(args.asset_dir, (8, 16, 32, 64), 2, slots, 0, target_sets=sets) as target:
        headers = {"Authorization": f"Bearer {target.admin_key}"}
        with httpx.Client(base_url=target.url, headers=headers, timeout=60.0) as client:
            for r in range(args.rounds):
                for name, mix in MIXES.items():
                    start = time.time()
                    samples = busy_samples(client, target, config, mix)
                    row = {
                        "round": r,
                        "mix": name,
                        "at": round(start, 1),
                        "samples": [
                            {
                                "adapter": s.adapter,
                                "lone_ms": s.lone_s * 1e3,
                                "busy_ms": s.busy_s * 1e3,
                            }
                            for s in samples
                        ],
                        "ratios": [round(s.ratio, 3) for s in samples],
                    }
                    ratios[name].extend(row["ratios"])
                    rows.append(row)
                    sys.stdout.write(
                        json.dumps({k: row[k] for k in ("round", "mix", "ratios")}) + "\n"
                    )
                    sys.stdout.flush()
    for name, values in ratios.items():
        if values:
            sys.stdout.write(
                f"{name} ({MIXES[name].describe()}): n {len(values)}, median "
                f"{statistics.median(values):.3f}\n"
            )
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
