"""Record every step (merged, tokens, seconds) of unmerged and auto replays of the bench's 80 %
trace, the merged-slower veto disabled (so merged stretches run to the end): data for A/A tests of
veto rules."""

import json
import random
import sys
import tempfile
from pathlib import Path

import loraplex.engine.mode_costs as mc
import loraplex.engine.mode_policy as mp
from loraplex.bench.modes.auto_mode import AutoMode
from loraplex.bench.modes.replay import replay, trace
from loraplex.bench.modes.setup import ModesBenchConfig, Setup
from loraplex.engine.mode_policy import MeasuredCosts, ModePolicyConfig

mp.SLOWER_MARGIN = mc.SLOWER_MARGIN = 1e9
preset, dtype, reps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ctx = 64 if preset == "small" else 32


class Rec(AutoMode):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.steps = []

    def after_step(self, now, seconds, chunks):
        self.steps.append((self.merged is not None, sum(n for _, n in chunks), seconds, now))
        super().after_step(now, seconds, chunks)


class Plain(Rec):  # never merges: an unmerged replay with the same bookkeeping
    def _decide(self, now):
        return


with tempfile.TemporaryDirectory() as tmp, open(out, "a") as f:
    config = ModesBenchConfig(preset=preset, dtype=dtype, batch_size=20, context_tokens=ctx)
    setup = Setup(Path(tmp), config)
    reqs = trace(random.Random(0), 64, 0.8, ctx, setup.model.config.vocab_size)
    costs = MeasuredCosts(0.02, 2e-4, unmerged_step_s_per_token=1e-3)
    for i in range(reps):
        for kind in ("plain", "auto", "auto", "plain"):
            a = (Plain if kind == "plain" else Rec)(setup, costs, ModePolicyConfig())
            try:
                run = replay(setup, reqs, 20, a)
            finally:
                a.close()
            row = dict(
                preset=preset, dtype=dtype, rep=i, kind=kind, secs=run.seconds, steps=a.steps
            )
            f.write(json.dumps(row) + "\n")
            f.flush()
            sys.stdout.write(f"{kind} {round(run.seconds, 2)} {run.merged_steps}\n")
            sys.stdout.flush()
