"""What loading the base checkpoint costs, in the process that loads it: peak and final resident
memory, how much of it is on huge pages, and the wall time of ``load_checkpoint``.

One load per process (a process's peak is only its own), freed heap kept as the engine keeps it.
Run it once with the code before a change and once after (``PYTHONPATH``), alternating, on one
checkpoint: ``--write DIR`` writes the random base of ``--preset`` there first. Prints one JSON
line. Timed use: ``flock /work/bench.lock nice -n -5 timeout 300 env PYTHONPATH=$PWD python
scripts/base-step-profile/load_pages.py DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def status_kib(*fields: str) -> dict[str, int]:
    """The named ``/proc/self/status`` and ``smaps_rollup`` fields, in KiB."""
    found: dict[str, int] = {}
    for source in ("/proc/self/status", "/proc/self/smaps_rollup"):
        for line in Path(source).read_text().splitlines():
            key = line.split(":")[0]
            if key in fields:
                found[key] = int(line.split()[1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--write", action="store_true", help="write the random base first")
    parser.add_argument("--preset", default="large")
    parser.add_argument("--linear-kernel", default="auto", help="base_linear_kernel to load with")
    args = parser.parse_args()
    if args.write:
        from loraplex.bench.adapters import write_random_base

        write_random_base(args.model_dir, args.preset, 0)
        return
    from loraplex.engine.heap import keep_freed_heap
    from loraplex.model.checkpoint import load_checkpoint

    torch.set_num_threads(1)
    heap_kept = keep_freed_heap()
    before = status_kib("VmRSS")["VmRSS"]
    start = time.perf_counter()
    model = load_checkpoint(args.model_dir, linear_kernel=args.linear_kernel)
    load_s = time.perf_counter() - start
    kib = status_kib("VmHWM", "VmRSS", "AnonHugePages")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {
        "name": "load-pages",
        "heap_kept": heap_kept,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "linear_kernel": model.linear_kernel,
        "weights_mib": weights >> 20,
        "weight_bytes": model.weight_bytes(),
        "packed_bytes": model.packed_bytes(),
        "load_s": round(load_s, 3),
        "rss_before_load_mib": before >> 10,
        "peak_rss_mib": kib["VmHWM"] >> 10,
        "rss_mib": kib["VmRSS"] >> 10,
        "anon_huge_pages_mib": kib.get("AnonHugePages", 0) >> 10,
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
