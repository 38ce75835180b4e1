"""A fleet's topology in the simulator (``SimConfig.topology``, ``sim/fleet.py``): the router's
real ``FleetTopology`` on the virtual clock dedicates a replica to the hot revision, that
replica reports it merged once in its GPU slots (as ``fleet.replica.routing_report`` does) and
runs it with no LoRA work, and the router keeps other revisions' cold loads off it."""

from __future__ import annotations

from collections import Counter

import pytest
from sim_inputs import cost, scenario

from loraplex.router import ReplicaReport
from loraplex.router.topology import TopologyConfig
from loraplex.sim import fleet
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.replica import SimReplica
from loraplex.sim.run import simulate

TOPOLOGY = TopologyConfig(window_s=5.0, min_dwell_s=10.0)


def test_the_hot_revision_gets_a_replica_reported_merged_and_the_tail_stays_off_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    merged: Counter[str] = Counter()
    report = fleet.SimFleetRouter._report

    def seen(self: fleet.SimFleetRouter, replica: SimReplica, now_s: float) -> ReplicaReport:
        made = report(self, replica, now_s)
        for key in made.residency.merged:
            merged[f"{replica.replica_id} {key}"] += 1
            assert key in made.residency.l0  # merged once in its GPU slots, as served
        return made

    monkeypatch.setattr(fleet.SimFleetRouter, "_report", seen)
    trace = scenario("hot-one", duration_s=30.0, rate=30.0)
    outcomes: list[Outcome] = []
    config = SimConfig(replicas=3, max_loras=3, topology=TOPOLOGY)
    result = simulate(trace, config, cost(), keep_outcomes=outcomes)
    assert len(merged) == 1, merged  # one replica, one revision, reported many times
    (which,) = merged
    replica_id, key = which.split(" ")
    assert "hot" in key and merged[which] > 10
    decisions = result.metrics["decisions"]
    assert decisions["merged"] > 0, decisions
    # once dedicated, the tail tenant's requests go elsewhere but for spills
    index = int(replica_id.rsplit("-", 1)[1])
    tail = [o for o in outcomes if o.tenant != "hot" and o.t_s > 10.0]
    on_it = sum(o.replica == index and o.reason != "dedicated_spill" for o in tail)
    assert tail and on_it <= len(tail) // 10, (on_it, len(tail))
    plain = simulate(trace, SimConfig(replicas=3, max_loras=3), cost()).metrics["decisions"]
    assert "merged" not in plain


def test_a_topology_that_is_not_a_topology_config_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="topology"):
        SimConfig(replicas=2, topology={"window_s": 5.0})  # type: ignore[arg-type]
