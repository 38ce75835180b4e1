#!/usr/bin/env python3
"""Memory across many merges: does merged mode's staging arena (``buffers.arena_mapping``,
``model/staged_merge.py``) or the merged weights leak? An offline engine on the demo set
(``.loraplex-assets/test-small``) merges and unmerges demo revisions ``--cycles`` times through
``ModeSwitcher`` (the switcher ``auto`` drives), in three ways in turn: a whole merge then an
unmerge, a staging begun, one piece staged and abandoned (what traffic that moved does), and a
staged merge pieced out to its commit then unmerged. Prints VmRSS (``/proc/self/status``) and
the process's mappings count every ``--every`` cycles. Bytes and counts, not timings. One JSON
line:

    scripts/attacks/attack26/merge-rss.py --cycles 300
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loraplex.clock import ManualClock
from loraplex.demo.assets import load_demo_assets
from loraplex.engine.mode_control import ref_of
from loraplex.engine.modes import ModeSwitcher
from loraplex.engine.offline import OfflineConfig, OfflineEngine

ADAPTERS = [("acme", "billing"), ("acme", "support"), ("globex", "search")]


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def mappings() -> int:
    return len(Path("/proc/self/maps").read_text().splitlines())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assets", default=".loraplex-assets/test-small")
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    args = parser.parse_args()
    assets = load_demo_assets(Path(args.assets))
    config = OfflineConfig(max_loras=3, max_lora_rank=64)
    samples = []
    with OfflineEngine(assets.base_model_dir, config) as engine:
        keys = [engine.adapter_key(assets.adapter(t, n, "r1").path) for t, n in ADAPTERS]
        cache = engine.runtime.cache
        switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, ManualClock())
        staged = switcher._merger.staged  # False: merged in place at the commit (no arena)
        for cycle in range(args.cycles + 1):
            if cycle % args.every == 0:
                samples.append({"cycle": cycle, "rss_kib": rss_kib(), "maps": mappings()})
            if cycle == args.cycles:
                break
            key = keys[cycle % len(keys)]
            lease = cache.acquire_future(key).result(timeout=60)
            way = cycle % 3
            if way == 0:
                switcher.merge(ref_of(key), lease)
                switcher.unmerge()
            elif way == 1:
                switcher.begin(ref_of(key), lease)
                switcher.advance(1e-9)
                switcher.abandon()  # a no-op when that one piece was all and it committed
                if switcher.merged_revision is not None:
                    switcher.unmerge()
            else:
                switcher.begin(ref_of(key), lease)
                while switcher.advance(1e-9) is None and switcher.staging_revision is not None:
                    pass
                if switcher.merged_revision is not None:
                    switcher.unmerge()
        cache.check_integrity()
        held = [e for e in cache.ledgers[next(iter(cache.ledgers))].entries.values()]
    first = samples[1] if len(samples) > 1 else samples[0]  # after the first arenas exist
    out = {
        "name": "merge-rss",
        "cycles": args.cycles,
        "samples": samples,
        "rss_growth_kib_after_first": samples[-1]["rss_kib"] - first["rss_kib"],
        "maps_growth_after_first": samples[-1]["maps"] - first["maps"],
        "copies_with_refs_at_end": sum(e.refcount > 0 for e in held),
        "staged_merger": staged,
    }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
