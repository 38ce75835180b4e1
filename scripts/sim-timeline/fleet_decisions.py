"""A real fleet run's routing decisions beside the simulator's, request by request.

Reads a ``bench sim --logs-dir`` fleet run (``fleet-r<repeat>-<trace>.client.jsonl``: the tier
each request's replica reported at its arrival) and the decisions the run's ingress logged
through ``decision_probe/`` (``LORAPLEX_PROBE_DECISIONS``: one line per ``Router.choose``, the
chosen replica, the reason and every offered replica's report as the router saw it), simulates
the same trace twice (replicas named as the run's own simulator named them, and named as the
real run's router named them, which sets every revision's rendezvous order and so where a cold
one is placed) with the same decisions logged, and prints per simulation: the requests whose
replica or tier differs, the first divergence, and each diverging decision's cause:

- ``order``: the revision's rendezvous order differs (only with the default ids: the placement
  preference is a hash of the replica ids);
- ``residency``: the router saw the revision in a different tier on some replica (an earlier
  divergence, or an eviction that went otherwise);
- ``load``: the same tiers, different load figures (queued, running, waiting for an adapter,
  evictions per minute): the least loaded of the placement set or of the holders differs;
- ``same``: the same view, a different choice (the router's own memory of decisions since
  the last reports).

and each request that went to the same replica but leased its adapter from another tier
(``tier_only``: the replica had evicted it, or not, by the time the request asked).

It reads runs of both placements: a run recorded while the fleet placed by Ray's replica ids
(its router's names those ids, its simulator's ``replica-000``, ..) and one since the fleet
places by rank (``rank-0``, .. on both sides: loraplex/fleet/routing.py, ``PlacementNames``).
The driver's own simulator logs decisions too; they are told from the fleet's by the probe's
``clock`` mark (``ManualClock``), or, in a file the probe wrote before that mark, by the
``replica-`` names, which a run with rank names cannot be read by (refused, naming why).

    PYTHONPATH=. python scripts/sim-timeline/fleet_decisions.py --logs-dir logs \
        --decisions decisions.jsonl --cost-model fleet.json --trace-requests 64 [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decision_probe.probe_views import replica_view
from logs import logged_runs

from loraplex.router import router as router_module
from loraplex.router.placement import rank_name, rendezvous_order
from loraplex.sim import cost_model as cost_file
from loraplex.sim import fleet as fleet_module
from loraplex.sim import replica as replica_module
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import simulate

LOAD_FIELDS = ("queued", "adapter_wait", "running", "evictions_per_min")
SIM_CLOCK = "ManualClock"  # the probe's ``clock`` of a simulator's router
RANK = re.compile(r"rank-(\d+)")  # a rank's placement name (``rank_name``)
OLD_SIM_PREFIX = "replica-"  # the simulator's names before it named replicas by rank


def fleet_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fleet's decisions among a probe file's ``lines``: the driver's own simulator decides
    too, in its own process; its ``pid`` is one whose lines carry the simulator's clock or,
    written before the probe logged it, name the old simulator's ``replica-`` replicas.
    SystemExit where the file cannot tell them apart (no mark, rank names only)."""
    driver = set()
    for d in lines:
        clock = d.get("clock")
        if clock is not None:
            if clock == SIM_CLOCK:
                driver.add(d["pid"])
        elif any(r.startswith(OLD_SIM_PREFIX) for r in d["replicas"]):
            driver.add(d["pid"])
        elif any(RANK.fullmatch(r) for r in d["replicas"]):
            raise SystemExit(
                f"decision of pid {d['pid']} names replicas by rank ({sorted(d['replicas'])}) "
                "and has no clock mark: the driver's simulator and the fleet name replicas "
                "alike since the fleet places by rank; record the run with the current probe"
            )
    return [d for d in lines if d["pid"] not in driver]


def real_names(probe: list[dict[str, Any]]) -> list[str]:
    """Every replica the fleet's router named, in the order the simulation's replicas take
    them: by rank (``rank-2`` before ``rank-10``) where the router named ranks, else sorted."""
    names = {d["chosen"] for d in probe} | {r for d in probe for r in d["replicas"]}
    if names and all(RANK.fullmatch(n) for n in names):
        return sorted(names, key=lambda n: int(n.removeprefix("rank-")))
    return sorted(names)


def own_names(ids: list[str]) -> list[str]:
    """What the run's own simulator named its replicas: ``rank-0``, .. as the fleet's router
    does where it named ranks (``ids``), else the ``replica-000``, .. of the simulator of the
    runs recorded while the fleet placed by Ray ids (today's simulator names ranks)."""
    if all(RANK.fullmatch(i) for i in ids):
        return [rank_name(i) for i in range(len(ids))]
    return [f"{OLD_SIM_PREFIX}{i:03d}" for i in range(len(ids))]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def simulated(
    run: Any, values: dict[str, Any], cost: Any, ids: list[str] | None, keys: dict[str, str]
) -> Any:
    """``run``'s trace simulated with replica ids ``ids`` and the router's names of the
    revisions ``keys`` (``tenant/name@revision`` -> the real key; None, {}: the simulator's
    own); its outcomes and its decisions (as the probe logs them, in routing order)."""
    decisions: list[dict[str, Any]] = []
    choose = router_module.Router.choose
    init = replica_module.SimReplica.__init__
    name = fleet_module.SimFleetRouter.name

    def real_name(self, key):  # type: ignore[no-untyped-def]
        own = name(self, key)
        real = keys.get(own.split("#", 1)[0])
        if real is not None and real != own:
            self._names[key] = real
            self._keys[real] = key
            return real
        return own

    def logged(self, request, replicas, *, replaces=None):  # type: ignore[no-untyped-def]
        decision = choose(self, request, replicas, replaces=replaces)
        now_s = self._clock.now()
        views = {
            replica_id: replica_view(report, request.adapter_key, now_s)
            for replica_id, report in replicas.items()
        }
        decisions.append(
            {
                "now_s": now_s,
                "adapter": request.adapter_key,
                "chosen": decision.replica_id,
                "reason": decision.reason.value,
                "replicas": views,
            }
        )
        return decision

    def named(self, index, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, index, *args, **kwargs)
        if ids is not None:
            self.replica_id = ids[index]

    router_module.Router.choose = logged  # type: ignore[method-assign]
    replica_module.SimReplica.__init__ = named  # type: ignore[method-assign]
    fleet_module.SimFleetRouter.name = real_name  # type: ignore[method-assign]
    try:
        kept: list[Outcome] = []
        simulate(run.trace, SimConfig(**values), cost, keep_outcomes=kept)
    finally:
        router_module.Router.choose = choose  # type: ignore[method-assign]
        replica_module.SimReplica.__init__ = init  # type: ignore[method-assign]
        fleet_module.SimFleetRouter.name = name  # type: ignore[method-assign]
    return kept, decisions


def matched(requests: list[Any], decisions: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Per trace request, the first unmatched decision on its revision (decisions are logged
    in routing order, which may swap requests that arrive close together)."""
    free = list(decisions)
    out: list[dict[str, Any] | None] = []
    for request in requests:
        suffix = f"/{request.adapter}@"
        hit = next(
            (
                d
                for d in free
                if d["adapter"] is not None
                and d["adapter"].startswith(f"{request.tenant}/")
                and suffix in d["adapter"]
            ),
            None,
        )
        if hit is not None:
            free.remove(hit)
        out.append(hit)
    return out


def cause(real: dict[str, Any], sim: dict[str, Any], ids: list[str], same_ids: bool) -> str:
    key = real["adapter"]
    if not same_ids and rendezvous_order(key, ids) and real["reason"] == "placement":
        return "order"
    rv, sv = real["replicas"], sim["replicas"]
    if any(rv.get(r, {}).get("tier") != sv.get(r, {}).get("tier") for r in ids):
        return "residency"
    if any(rv.get(r, {}).get(f) != sv.get(r, {}).get(f) for r in ids for f in LOAD_FIELDS):
        return "load"
    return "same"


def compare(
    run: Any, client: list[dict[str, Any]], real: list[dict[str, Any] | None],
    kept: list[Outcome], sim: list[dict[str, Any]], *, ids: list[str], same_ids: bool,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    sim_ids = ids if same_ids else own_names(ids)
    causes: Counter[str] = Counter()
    tiers: Counter[str] = Counter()
    rows = []
    first = None
    # the simulator decides in trace order: its decisions are the requests' in order
    for i, (request, c, r, o, s) in enumerate(
        zip(run.workload.requests, client, real, kept, sim, strict=True)
    ):
        sim_chosen = sim_ids[o.replica]
        real_chosen = None if r is None else r["chosen"]
        row = {
            "i": i,
            "t_s": request.t_s,
            "adapter": f"{request.tenant}/{request.adapter}",
            "real_replica": real_chosen,
            "sim_replica": sim_chosen,
            "real_reason": None if r is None else r["reason"],
            "sim_reason": o.reason,
            "real_tier": c["tier"],
            "sim_tier": o.tier,
        }
        if r is None:
            row["cause"] = "unlogged"
        elif same_ids and real_chosen != sim_chosen:
            row["cause"] = cause(r, s, ids, same_ids)
        elif not same_ids and (ids.index(real_chosen) != o.replica if real_chosen in ids else True):
            # the replicas cannot be named alike: count a decision as diverging where the
            # chosen replica's tier for the revision differs
            row["cause"] = "order" if r["reason"] == "placement" else "unpaired"
        elif c["tier"] != o.tier:
            row["cause"] = "tier_only"
        if "cause" in row:
            causes[row["cause"]] += 1
            if first is None:
                first = row
        tiers[f"{c['tier']}/{o.tier}"] += 1
        rows.append(row)
    real_tiers = Counter(c["tier"] for c in client)
    sim_tiers = Counter(o.tier or "none" for o in kept)
    n = len(client)
    body = {
        "requests": n,
        "causes": dict(sorted(causes.items())),
        "first_divergence": first,
        "tiers_real_sim": dict(sorted(tiers.items())),
        "hit_real": {t: round(v / n, 4) for t, v in sorted(real_tiers.items())},
        "hit_sim": {t: round(v / n, 4) for t, v in sorted(sim_tiers.items())},
        "reasons_real": dict(sorted(Counter(x["reason"] for x in real if x).items())),
        "reasons_sim": dict(sorted(Counter(o.reason for o in kept).items())),
    }
    return body, rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs-dir", type=Path, required=True)
    parser.add_argument("--decisions", type=Path, required=True)
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--trace-requests", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    cost = cost_file.load(args.cost_model)
    logged = logged_runs(args.logs_dir, args.trace_requests, "fleet")
    lines = [d for d in _lines(args.decisions) if d["adapter"] is not None and not d["retry"]]
    probe = fleet_lines(lines)
    out = None if args.out is None else args.out.open("w", encoding="utf-8")
    for run in logged.runs:
        client = _lines(run.path)
        # one run per probe file: its decisions are the run's
        real = matched(list(run.workload.requests), probe)
        ids = real_names(probe)
        keys = {d["adapter"].split("#", 1)[0]: d["adapter"] for d in probe}
        for label, same in (("sim_ids", False), ("real_ids", True)):
            kept, sim = simulated(
                run, logged.values, cost, ids if same else own_names(ids), keys if same else {}
            )
            body, rows = compare(run, client, real, kept, sim, ids=ids, same_ids=same)
            sys.stdout.write(f"{run.stem} {label} {json.dumps(body)}\n")
            if out is not None:
                for row in rows:
                    out.write(json.dumps({"run": run.stem, "sim": label, **row}) + "\n")


if __name__ == "__main__":
    main()
