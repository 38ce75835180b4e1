"""Back-to-back merges as ``bench modes``' ``transition_ms`` runs them (large preset, bfloat16, one
torch thread): per merge its ms split into begin (negative pool, staging object), staging
(``advance(inf)``: every module written) and commit, the staging's user and system CPU ms and
minor page faults; then the unmerge and (trees with the arena's ``releases``) its release.

Usage, from the tree to measure: ``python probe.py LABEL [PAIRS] [PAUSE_S]`` (PAUSE_S idle seconds
before each merge: 0 is the bench's back to back; docs/modes.md, "The veto's evidence").
"""

import json
import math
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from loraplex.bench.modes.setup import HOT, ModesBenchConfig, Setup


def flt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime, u.ru_stime


torch.set_num_threads(1)
n = int(sys.argv[2]) if len(sys.argv) > 2 else 6
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # seconds idle before each merge
with tempfile.TemporaryDirectory() as tmp:
    config = ModesBenchConfig(preset="large", dtype="bfloat16", batch_size=20, context_tokens=32)
    setup = Setup(Path(tmp), config)
    rows = []
    for _ in range(n):
        time.sleep(pause)
        t0, f0 = time.perf_counter(), flt()
        staging = setup.begin_merge(HOT)
        t1, f1 = time.perf_counter(), flt()
        c1 = cpu()
        staging.advance(math.inf)
        c2 = cpu()
        t2, f2 = time.perf_counter(), flt()
        setup.commit(staging, HOT)
        t3, f3 = time.perf_counter(), flt()
        try:
            setup.unmerge(release_now=False)
        except TypeError:
            setup.unmerge()
        t4, f4 = time.perf_counter(), flt()
        rel = getattr(setup.merger, "releases", None)
        if rel is not None:
            rel.drain()
        t5, f5 = time.perf_counter(), flt()
        rows.append(
            dict(
                merge_ms=(t3 - t0) * 1e3,
                begin_ms=(t1 - t0) * 1e3,
                stage_ms=(t2 - t1) * 1e3,
                commit_ms=(t3 - t2) * 1e3,
                stage_minflt=f2 - f1,
                stage_user_ms=(c2[0] - c1[0]) * 1e3,
                stage_sys_ms=(c2[1] - c1[1]) * 1e3,
                unmerge_ms=(t4 - t3) * 1e3,
                release_ms=(t5 - t4) * 1e3,
                unmerge_minflt=f5 - f3,
            )
        )
    sys.stdout.write(json.dumps(dict(tree=sys.argv[1], pause_s=pause, rows=rows)) + "\n")
