"""Where ``bench modes``' 80 % replay's wall time goes, auto against unmerged (issue 28;
docs/modes.md, twenty-second pass).

``bench modes``' replays alone (bench/modes/replay.py) on its setup and settings: 20 closed-loop
clients, 64-token prompts, 64 requests of the 80 % trace, a warm-up pair then ``rounds`` ABBA
rounds (``replay.compare_modes``, parity checked as in the bench). The trace is drawn from
``Random(seed)`` directly, so it is not the bench's own trace (same shape, other requests).
Optional ``key=value`` arguments set ``ModePolicyConfig`` fields (e.g. ``min_measured_steps=2``)
to see what a policy setting would change on this replay.

Prints one JSON line: the replay summary, whose ``time_split`` (bench/modes/replay_split.py) is
the decomposition. Run niced under the benchmark lock, e.g.
``flock /work/bench.lock nice -n -5 python scripts/modes-replay-split/probe.py bfloat16 3``.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from loraplex.bench.modes.figures import transition_ms
from loraplex.bench.modes.parity import ParityReport, ParityRule
from loraplex.bench.modes.replay import compare_modes, trace
from loraplex.bench.modes.setup import ModesBenchConfig, Setup
from loraplex.engine.mode_policy import MeasuredCosts, ModePolicyConfig


def main(dtype: str, rounds: int, overrides: list[str]) -> None:
    fields = {key: float(value) for key, value in (item.split("=", 1) for item in overrides)}
    ints = {"min_measured_steps", "min_window_tokens"}
    policy = ModePolicyConfig(**{k: int(v) if k in ints else v for k, v in fields.items()})
    config = ModesBenchConfig(batch_size=20, context_tokens=64, replay_requests=64, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        merges, unmerges = transition_ms(setup)
        costs = MeasuredCosts(statistics.median(merges + unmerges) / 1000, 0.0)
        vocab = setup.model.config.vocab_size
        requests = trace(random.Random(config.seed), 64, 0.8, 64, vocab)
        report = ParityReport(ParityRule.for_dtype(dtype))
        got = compare_modes(setup, requests, 20, costs, rounds, report=report, policy=policy)
    sys.stdout.write(
        json.dumps({"dtype": dtype, "rounds": rounds, "policy": fields, "replay": got}) + "\n"
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
