"""hot-one with the fleet split by hand: the hot revision on one replica of its own, the tail on
the other two (the default policy), an idealised bound on idea (b) of docs/benchmarks/fleet.md
(a replica dedicated to the hot revision, merged), which the simulator does not model.

``--merged`` sends the hot revision's requests as base-model requests (a merged revision's
tokens run with no LoRA work), else as its adapter's. Idealised: the split is fixed from the
first request (no topology window, no merge transition, no overflow from a saturated dedicated
replica to the others). One JSON line per rate and seed, then the medians.

    PYTHONPATH=. python scripts/sim-hot-one/split_bound.py --rates 40,50,60,75,90 [--merged]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

from study import DEFAULT, add_cost_model, own_cores_model

from loraplex.cli.sim import workload_trace
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.result import ttft_ms
from loraplex.sim.run import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="40,50,60,75,90", help="requests per second")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--merged", action="store_true", help="the hot revision as base model")
    add_cost_model(parser)
    args = parser.parse_args()
    model = own_cores_model(args.cost_model)
    timeout_s = SimConfig().timeout_s
    p99: dict[float, list[float]] = {}
    for rate in (float(r) for r in args.rates.split(",")):
        for seed in range(args.seeds):
            trace = workload_trace("hot-one", seed, args.duration_s, rate)
            hot = [r for r in trace if r.tenant == "hot"]
            if args.merged:
                hot = [dataclasses.replace(r, adapter=None, rank=None) for r in hot]
            tail = [r for r in trace if r.tenant != "hot"]
            hot_out: list[Outcome] = []
            tail_out: list[Outcome] = []
            simulate(hot, SimConfig(replicas=1, max_loras=3), model, keep_outcomes=hot_out)
            config = SimConfig(replicas=2, max_loras=3, routing_policy=DEFAULT, seed=seed)
            simulate(tail, config, model, keep_outcomes=tail_out)
            both = ttft_ms(hot_out + tail_out, timeout_s)
            p99.setdefault(rate, []).append(both["p99"] or 0.0)
            line = {
                "split": "merged" if args.merged else "adapter",
                "rate": rate,
                "seed": seed,
                "ttft_ms": both,
                "by_tenant_p99_ms": {
                    "hot": ttft_ms(hot_out, timeout_s)["p99"],
                    "tail": ttft_ms(tail_out, timeout_s)["p99"],
                },
            }
            sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    for rate, values in sorted(p99.items()):
        median = statistics.median(values)
        sys.stdout.write(f"# {rate:g} req/s: split P99 median {median:,.0f} ms\n")


if __name__ == "__main__":
    main()
