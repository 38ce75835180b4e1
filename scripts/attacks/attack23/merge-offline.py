#!/usr/bin/env python3
"""Other tenants' greedy tokens and logprobs with a huge-weight adapter merged, against unmerged.

An ``OfflineEngine`` (``dtype`` the first argument) on the demo set (``.loraplex-assets/
test-small``): for each factor of the comma-separated second argument, a copy of
``acme/billing@r1`` whose A and B are scaled by ``sqrt(factor)`` (so ``s B A`` by ``factor``)
runs beside three other requests (``globex/codegen@r1``; the base model; ``acme/support@r1``),
16 greedy tokens each with ``logprobs`` 5, once unmerged and once with the copy merged at step 0
(``ModeSwitcher``, as ``auto`` would); then once more unmerged after the unmerge. One JSON line
per factor: whether the others' tokens are the same, their largest logprob difference when they
are, and the first divergence judged as docs/modes.md's parity rule (near tie: each side's token
in the other's top 5 and the gap under 0.204 nats). Where the merge is refused
(attack23's fix), ``merged`` is false and ``refused`` says why::

    PYTHONPATH=$PWD python scripts/attacks/attack23/merge-offline.py bfloat16 1,10,100,1000
"""

import json
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from loraplex.clock import MonotonicClock
from loraplex.demo.assets import load_demo_assets
from loraplex.engine.modes import ModeSwitcher
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.sampling import SamplingParams

dtype = sys.argv[1]
factors = [float(f) for f in sys.argv[2].split(",")]
assets = load_demo_assets(Path(".loraplex-assets/test-small"))
root = Path(f"/tmp/a23/scaled-{dtype}")
shutil.rmtree(root, ignore_errors=True)
root.mkdir()
hot = assets.adapter("acme", "billing", "r1")
others = [assets.adapter("globex", "codegen", "r1"), assets.adapter("acme", "support", "r1")]
P = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=5)


def scaled(f):
    d = root / f"x{f:g}"
    shutil.copytree(hot.path, d)
    w = d / "adapter_model.safetensors"
    t = {k: (v.double() * (f**0.5)).float() for k, v in load_file(w).items()}  # B*A scales by f
    save_file(t, w)
    return d


def div(w, g):
    for i, (a, b) in enumerate(zip(w.logprobs, g.logprobs, strict=True)):
        if a.token_id != b.token_id:
            mine = dict(a.top[:5])
            theirs = dict(b.top[:5])
            gap = mine[a.token_id] - mine[b.token_id] if b.token_id in mine else None
            near = gap is not None and a.token_id in theirs and gap < 0.204
            return {"pos": i, "gap": None if gap is None else round(gap, 4), "near_tie": near}
    return None


def batch(hot_dir):
    return [
        OfflineRequest(hot.probe_prompt, hot_dir, P),
        OfflineRequest(others[0].probe_prompt, others[0].path, P),
        OfflineRequest(others[1].probe_prompt, None, P),
        OfflineRequest(others[1].probe_prompt, others[1].path, P),
    ]


with OfflineEngine(
    assets.base_model_dir, OfflineConfig(dtype=dtype, max_loras=4, max_lora_rank=64)
) as eng:
    for f in factors:
        d = scaled(f)
        want = eng.generate(batch(d))
        sw = ModeSwitcher(eng.core.runner, eng.runtime.pool, MonotonicClock())
        key = eng.adapter_key(d)

        def between(step, sw=sw, key=key):
            if step == 0:
                sw.merge("acme/billing@x", eng.runtime.cache.acquire_future(key).result(60))

        try:
            got = eng.generate(batch(d), between)
            err = None
        except Exception as e:
            got, err = None, repr(e)[:200]
        merged = sw.merged_revision is not None
        refused = list(getattr(sw, "refused", {}).values())
        if sw.merged_revision is not None:
            sw.unmerge()
        after = eng.generate(batch(d))
        row = {"dtype": dtype, "factor": f, "error": err, "merged": merged, "refused": refused}
        if got:
            row["others_same_tokens"] = [
                w.token_ids == g.token_ids for w, g in zip(want[1:], got[1:], strict=True)
            ]
            row["others_max_logprob_diff"] = [
                max(abs(a.logprob - b.logprob) for a, b in zip(w.logprobs, g.logprobs, strict=True))
                if w.token_ids == g.token_ids
                else None
                for w, g in zip(want[1:], got[1:], strict=True)
            ]
            row["others_first_divergence"] = [
                div(w, g) for w, g in zip(want[1:], got[1:], strict=True)
            ]
            row["hot_same"] = want[0].token_ids == got[0].token_ids
        row["after_unmerge_same"] = [
            w.token_ids == a.token_ids for w, a in zip(want, after, strict=True)
        ]
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()
