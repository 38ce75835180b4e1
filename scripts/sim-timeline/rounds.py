"""``sim calibrate-fleet``'s contention rounds (k clients, 4 back-to-back requests each, 16
prompt and 8 output tokens, over the rank-8 and rank-64 adapters) replayed in the simulator as a
closed loop (each client's next arrival is its last request's end: iterated to a fixed point),
with and without the fleet file's curve (docs/simulator.md, "SIMFLEET2"): does the simulator,
charged with the curve, reproduce the throughputs X(k) the curve was fitted from?

    python scripts/sim-timeline/rounds.py fleet.json 13.11,14.62,22.04,25.76
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplex.bench.sim.bench import SimBenchConfig, adapter_sizes, sim_config
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter
from loraplex.demo.assets import generate_demo_assets
from loraplex.sim import cost_model as cost_file
from loraplex.sim import cpu
from loraplex.sim import run as sim_run
from loraplex.sim.config import SimConfig
from loraplex.sim.trace import TraceRecord

COUNTS = (1, 2, 4, 8)
PER_CLIENT = 4
START_S = 5.0  # after the warm-up requests
TENANT = "fleetcal"
_captured: dict[str, list[Any]] = {}
_result = sim_run._result


def _grab(trace: Any, config: Any, cost_model: Any, **kw: Any) -> Any:
    """``simulate``'s outcomes, per request (its result holds figures only)."""
    _captured["outcomes"] = list(kw["outcomes"])
    return _result(trace, config, cost_model, **kw)


class Rounds:
    def __init__(self) -> None:
        model_dir = generate_demo_assets(
            Path(".loraplex-assets/test-small"), preset="small", seed=0
        ).base_model_dir
        self.adapters = [TraceAdapter(TENANT, f"r{r}", r, ATTENTION_TARGETS) for r in (8, 64)]
        self.sizes, per_rank = adapter_sizes(model_dir, self.adapters)
        self.config = SimConfig(**sim_config(SimBenchConfig(), "fleet", per_rank, {}))

    def record(self, t_s: float, client: int) -> TraceRecord:
        a = self.adapters[client % 2]
        return TraceRecord(t_s, TENANT, a.name, 16, 8, a.rank, self.sizes[(TENANT, a.name)])

    def rate(self, model: cost_file.CostModel, clients: int) -> float:
        """Completed requests per second of ``clients`` closed-loop clients."""
        warm = [self.record(0.5 * i, i) for i in range(4)]
        arrivals = [[START_S + 0.08 * i for i in range(PER_CLIENT)] for _ in range(clients)]
        for _ in range(50):
            rows = sorted((t, c, i) for c in range(clients) for i, t in enumerate(arrivals[c]))
            sim_run.simulate(warm + [self.record(t, c) for t, c, _ in rows], self.config, model)
            outcomes = _captured["outcomes"][len(warm) :]
            ends = {(c, i): o.end_s for (_, c, i), o in zip(rows, outcomes, strict=True)}
            new = [
                [START_S] + [ends[(c, i)] for i in range(PER_CLIENT - 1)] for c in range(clients)
            ]
            moved = max(
                abs(a - b)
                for x, y in zip(new, arrivals, strict=True)
                for a, b in zip(x, y, strict=True)
            )
            arrivals = new
            if moved < 1e-9:
                break
        return clients * PER_CLIENT / (max(ends.values()) - START_S)


def main() -> None:
    sim_run._result = _grab  # type: ignore[assignment]
    rounds = Rounds()
    base = cost_file.load(Path(sys.argv[1]))
    sys.stdout.write(f"measured {dict(zip(COUNTS, sys.argv[2].split(','), strict=True))}\n")
    unbent = replace(base, fleet_contention=None)
    for name, model in (("curve on steps and hops", base), ("no curve", unbent)):
        rates = {k: round(rounds.rate(model, k), 2) for k in COUNTS}
        sys.stdout.write(f"{name}: {rates}\n")
    cpu.CpuShare.hop_stretch = lambda self: 1.0  # type: ignore[method-assign]
    rates = {k: round(rounds.rate(base, k), 2) for k in COUNTS}
    sys.stdout.write(f"curve on steps only: {rates}\n")


if __name__ == "__main__":
    main()
