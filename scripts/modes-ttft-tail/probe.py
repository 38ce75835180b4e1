"""Where ``bench modes``' 80 % replay gets its P99 TTFT, per request (issue 28; docs/modes.md,
twenty-first pass).

``bench modes``' replay alone (bench/modes/replay.py), on its setup and settings: 20 closed-loop
clients, 64-token prompts, 64 requests of the 80 % trace, a warm-up pair then ``rounds`` ABBA
rounds of unmerged and ``auto`` (the costs' transition from ``transition_ms`` as the bench
measures it; the replay's ``auto`` measures its own step and LoRA costs). The trace is drawn
from ``Random(seed)`` directly, so it is not the bench's own trace (the bench draws its
skewed batch and share sweep first): same shape, other requests.

Prints one JSON line: the replay summary (``replay.summary``: P99, the tail's requests by step,
the slowest opening burst, the P99 after it) and per mode the ``top`` slowest requests: replay
number, step of the first token, TTFT in ms, whether a transition preceded that step, and
each replay's opening step in ms. Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/modes-ttft-tail/probe.py bfloat16 3``
(arguments: dtype, ABBA rounds, optional number of slowest requests to list, default 12).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from loraplex.bench.modes.auto_mode import AutoMode
from loraplex.bench.modes.figures import transition_ms
from loraplex.bench.modes.replay import ReplayRun, replay, summary, trace
from loraplex.bench.modes.setup import ModesBenchConfig, Setup
from loraplex.engine.mode_policy import MeasuredCosts, ModePolicyConfig


def slowest(runs: list[ReplayRun], top: int) -> list[list[object]]:
    rows = []
    for number, run in enumerate(runs):
        after = set(run.after_transition)
        for ttft, step in zip(run.ttft_s, run.first_step, strict=True):
            rows.append([number, step, round(ttft * 1000, 2), step in after])
    return sorted(rows, key=lambda row: -float(str(row[2])))[:top]


def main(dtype: str, rounds: int, top: int = 12) -> None:
    config = ModesBenchConfig(
        batch_size=20, context_tokens=64, replay_requests=64, replay_rounds=rounds, dtype=dtype
    )
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        merges, unmerges = transition_ms(setup)
        costs = MeasuredCosts(statistics.median(merges + unmerges) / 1000, 0.0)
        vocab = setup.model.config.vocab_size
        requests = trace(random.Random(config.seed), 64, 0.8, 64, vocab)
        runs: dict[str, list[ReplayRun]] = {"unmerged": [], "auto": []}
        order = ["unmerged", "auto"] + ["unmerged", "auto", "auto", "unmerged"] * rounds
        for number, name in enumerate(order):
            auto = AutoMode(setup, costs, ModePolicyConfig()) if name == "auto" else None
            try:
                run = replay(setup, requests, config.batch_size, auto)
            finally:
                if auto is not None:
                    auto.close()
            if number >= 2:
                runs[name].append(run)
    opening = {  # each replay's opening step: its first clients' TTFT
        name: [round(r.ttft_s[r.first_step.index(0)] * 1000, 2) for r in done]
        for name, done in runs.items()
    }
    out = {
        "name": "modes_ttft_tail",
        "dtype": dtype,
        "rounds": rounds,
        "transition_ms_p50": statistics.median(merges + unmerges),
        "summary": summary(runs["unmerged"], runs["auto"]),
        "opening_ms": opening,
        "after_transition": {
            name: [r.after_transition for r in done] for name, done in runs.items()
        },
        "top": {name: slowest(done, top) for name, done in runs.items()},
    }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))
