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

from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.contention_fit import RoundShape, simulated_rate
from loraplex.bench.sim.simulated import adapter_sizes, sim_config
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter
from loraplex.demo.assets import generate_demo_assets
from loraplex.sim import cost_model as cost_file
from loraplex.sim import cpu
from loraplex.sim.config import SimConfig

COUNTS = (1, 2, 4, 8)
PER_CLIENT = 4
TENANT = "fleetcal"


class Rounds:
    """SIMFLEET2's rounds (the rank-8 and rank-64 lone adapters), replayed by the package's
    ``contention_fit.simulated_rate`` (the same closed loop this script first held)."""

    def __init__(self) -> None:
        model_dir = generate_demo_assets(
            Path(".loraplex-assets/test-small"), preset="small", seed=0
        ).base_model_dir
        adapters = [TraceAdapter(TENANT, f"r{r}", r, ATTENTION_TARGETS) for r in (8, 64)]
        sizes, per_rank = adapter_sizes(model_dir, adapters)
        self.config = SimConfig(**sim_config(SimBenchConfig(), "fleet", per_rank, {}))
        rows = tuple((a.tenant, a.name, a.rank, sizes[(a.tenant, a.name)]) for a in adapters)
        self.shape = RoundShape(rows, PER_CLIENT, 16, 8)

    def rate(self, model: cost_file.CostModel, clients: int) -> float:
        """Completed requests per second of ``clients`` closed-loop clients."""
        return simulated_rate(model, self.config, self.shape, clients)


def main() -> None:
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
