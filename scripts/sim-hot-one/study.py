"""hot-one in the simulator: the routing policies on shared cores and on cores of their own.

The real `bench fleet` runs its 3 replicas on this machine's 2 cores; hot-one's premise (one
revision asking more than one replica can serve) assumes replicas with capacity of their own.
This runs a fleet cost model (``--cost-model``, default ``FLEET_COSTS``) as calibrated
(`cores` 2, the co-located replicas' step scale) and a variant with `cores` unset and no
co-location scale (each replica steps at the lone server's speed: replicas on cores of their
own), every routing policy, several rates and seeds, and prints one JSON line per run and the
P99 ratios against the default policy.

    PYTHONPATH=. python scripts/sim-hot-one/study.py --rates 10,14 --shared
    PYTHONPATH=. python scripts/sim-hot-one/study.py --rates 40,50,60
    PYTHONPATH=. python scripts/sim-hot-one/study.py --lone --rates 20,30,40,50 [--shared]
    PYTHONPATH=. python scripts/sim-hot-one/study.py --workload zipf-longtail --rates 40 \
        --policies affinity,affinity_until_saturated

``--workload`` runs another bench workload than hot-one (its lines then carry ``workload``);
``--policies`` runs only the policies named (the ratios need the default among them);
``--against NAME`` prints the P99 ratios over that policy instead of the default's;
``--topology`` also runs the default policy, and each ``--reach`` variant, with a fleet topology
(``SimConfig.topology``, the default ``TopologyConfig``: a replica dedicated to a revision of a
replica's worth of demand, run merged, other revisions' cold loads kept off it) as the policy
``affinity_until_saturated+topology`` (``.../reach=1+topology``), and ``ReportedPolicy`` with
one (``affinity_until_saturated/reported+topology``);
``--reach 1,2`` also runs the default policy with ``RouterConfig.spread_after_s`` at each value
(rule 4's reach, docs/router.md), as the policy ``affinity_until_saturated/reach=1`` and so on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from pathlib import Path

from loraplex.bench.workloads import SCENARIOS
from loraplex.cli.sim import workload_trace
from loraplex.router import Reason, RouterConfig, RouteRequest, policy_names, register_policy
from loraplex.router.affinity import AffinityUntilSaturatedPolicy
from loraplex.router.topology import TopologyConfig
from loraplex.router.view import ReplicaView
from loraplex.sim import cost_model as costs
from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate

# The fleet cost file the README's example names (docs/simulator.md, "The example cost file").
# NOTE: the studies recorded in docs/benchmarks/fleet.md ran with the undated
# `sim-cost-cpu-2core-demo-small-fleet.json`: pass it as --cost-model to repeat them.
FLEET_COSTS = Path("docs/benchmarks/sim-cost-cpu-2core-demo-small-2026-12-05-both20-fleet.json")
DEFAULT = "affinity_until_saturated"
WITH_TOPOLOGY = "+topology"  # a policy's name with SimConfig.topology (--topology)


def register_reach(spread_after_s: float) -> str:
    """Registers the default policy with ``spread_after_s`` set and returns its name."""
    name = f"{DEFAULT}/reach={spread_after_s:g}"

    def factory(config: RouterConfig, rng: random.Random) -> AffinityUntilSaturatedPolicy:
        return AffinityUntilSaturatedPolicy(
            dataclasses.replace(config, spread_after_s=spread_after_s), rng
        )

    register_policy(name, factory)
    return name


class ReportedPolicy(AffinityUntilSaturatedPolicy):
    """The default policy, but a revision with a dedicated replica goes there while that
    replica's *reported* load is below saturation (the router's own decisions since the report
    not counted; ``view.utilization`` counts them as queued); else as the default routes it.
    A variant for this study, not the router's; it differs from the default only with a
    topology, so ``--topology`` alone runs it (``affinity_until_saturated/reported+topology``)."""

    name = f"{DEFAULT}/reported"

    def _pick(
        self,
        request: RouteRequest,
        known: list[ReplicaView],
        open_: list[ReplicaView],
        holding: dict[ReplicaView, tuple[bool, float, str]],
        now_s: float,
    ) -> tuple[ReplicaView, Reason]:
        key, config = request.adapter_key, self._config
        for view in known if key is not None else ():
            if view.dedicated == key and view.report is not None:
                load = view.report.load
                reported = max(
                    load.num_queued / config.max_queued,
                    (load.num_queued + load.num_running) / config.max_ongoing,
                    load.kv_usage / config.max_kv_usage,
                )
                if reported < 1.0:
                    return view, Reason.MERGED
        return super()._pick(request, known, open_, holding, now_s)


register_policy(ReportedPolicy.name, ReportedPolicy)


def add_cost_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cost-model",
        type=Path,
        default=FLEET_COSTS,
        help=f"a fleet cost file (sim calibrate-fleet; default {FLEET_COSTS})",
    )


def own_cores_model(path: Path) -> costs.CostModel:
    """The fleet cost model with `cores` unset and no co-location scale."""
    body = json.loads(path.read_text())
    body["cores"] = None
    body.pop("fleet_cpu_scale", None)
    return costs.from_dict(body, origin=f"{path} (cores unset, no co-location scale)")


def lone(model: costs.CostModel, cores: str, rates: list[float], duration_s: float) -> None:
    """One replica serving hot-one's hot revision alone, at each rate of that revision."""
    for rate in rates:
        trace = workload_trace("hot-one", 0, duration_s, rate / 0.6)  # the hot share is 60 %
        hot = [r for r in trace if r.tenant == "hot"]
        m = simulate(hot, SimConfig(replicas=1, max_loras=3), model).metrics
        line = {
            "cores": cores,
            "lone_hot_rate": rate,
            "ttft_ms": m["ttft_ms"],
            "throughput_requests_per_s": m["throughput_requests_per_s"],
        }
        sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="40,50,60", help="requests per second, comma-separated")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--workload", default="hot-one", help="a bench workload (hot-one, zipf-longtail, ...)"
    )
    parser.add_argument("--duration-s", type=float, default=40.0)
    add_cost_model(parser)
    parser.add_argument("--shared", action="store_true", help="the model as calibrated")
    parser.add_argument(
        "--lone", action="store_true", help="one replica, the hot revision's requests alone"
    )
    parser.add_argument(
        "--policies", default="", help="comma-separated routing policies (default: every one)"
    )
    parser.add_argument(
        "--reach",
        default="",
        help="comma-separated spread_after_s values: the default policy with each (also run)",
    )
    parser.add_argument(
        "--against", default=DEFAULT, help="the policy the printed P99 ratios divide by"
    )
    parser.add_argument(
        "--topology",
        action="store_true",
        help="also run the default and each --reach with a topology (the module docstring)",
    )
    args = parser.parse_args()
    reach = [register_reach(float(v)) for v in args.reach.split(",")] if args.reach else []
    if args.workload not in SCENARIOS:
        parser.error(f"--workload {args.workload!r}: expected one of {sorted(SCENARIOS)}")
    named = [p for p in policy_names() if p != ReportedPolicy.name]  # alone: the default
    policies = args.policies.split(",") if args.policies else named
    policies += [p for p in reach if p not in policies]
    unknown = [p for p in policies if p not in policy_names()]
    if args.topology:  # the default and each reach, with a topology
        policies += [f"{p}{WITH_TOPOLOGY}" for p in (DEFAULT, ReportedPolicy.name, *reach)]
    if unknown:
        parser.error(f"--policies {','.join(unknown)}: expected some of {policy_names()}")
    model = costs.load(args.cost_model) if args.shared else own_cores_model(args.cost_model)
    cores = "shared" if args.shared else "own"
    if args.lone:
        if args.workload != "hot-one":
            parser.error("--lone needs --workload hot-one")
        lone(model, cores, [float(r) for r in args.rates.split(",")], args.duration_s)
        return
    p99: dict[tuple[float, str], list[float]] = {}
    for rate in (float(r) for r in args.rates.split(",")):
        for seed in range(args.seeds):
            trace = workload_trace(args.workload, seed, args.duration_s, rate)
            for policy in policies:
                routing = policy.removesuffix(WITH_TOPOLOGY)
                topology = TopologyConfig() if routing != policy else None
                config = SimConfig(
                    replicas=3, max_loras=3, routing_policy=routing, seed=seed, topology=topology
                )
                m = simulate(trace, config, model).metrics
                p99.setdefault((rate, policy), []).append(m["ttft_ms"]["p99"])
                line = {
                    "cores": cores,
                    **({} if args.workload == "hot-one" else {"workload": args.workload}),
                    "rate": rate,
                    "seed": seed,
                    "policy": policy,
                    "ttft_ms": m["ttft_ms"],
                    "l0_hit_ratio": m["l0_hit_ratio"],
                    "by_tenant_p99_ms": {
                        t: v["ttft_ms"]["p99"] for t, v in sorted(m["by_tenant"].items())
                    },
                    "decisions": m["decisions"],
                }
                sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    label = "" if args.workload == "hot-one" else f"{args.workload}, "
    against = args.against
    for (rate, policy), values in sorted(p99.items()):
        if policy == against or (rate, against) not in p99:
            continue
        ratios = [a / b for a, b in zip(values, p99[(rate, against)], strict=True)]
        sys.stdout.write(
            f"# {label}{cores} cores, {rate:g} req/s: P99 {policy} / {against} median "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]\n"
        )


if __name__ == "__main__":
    main()
