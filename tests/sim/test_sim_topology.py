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
from loraplex.sim import fleet, run
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.replica import SimReplica
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

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


def test_a_topology_that_would_never_dedicate_is_refused() -> None:
    """One replica has no router, fewer than ``min_replicas`` dedicate none, and the Ray
    baselines never send a dedicated revision's traffic to its replica: each was taken in
    silence and did nothing (``[fleet] topology`` refuses the last too)."""
    with pytest.raises(ValueError, match=r"^topology is set with replicas 1; expected"):
        SimConfig(replicas=1, topology=TOPOLOGY)
    with pytest.raises(ValueError, match="replicas 3; expected replicas >= its min_replicas 4"):
        SimConfig(replicas=3, topology=TopologyConfig(min_replicas=4))
    for policy in ("pow2", "ray_multiplex"):
        with pytest.raises(ValueError, match=f"routing_policy is '{policy}', which does not"):
            SimConfig(replicas=2, routing_policy=policy, topology=TOPOLOGY)
    assert SimConfig(replicas=2, routing_policy="affinity", topology=TOPOLOGY).topology


def _refused_hot_trace() -> list[TraceRecord]:
    """Every 0.1 s a tail request (one of ten revisions, 200 prompt tokens), and every 0.2 s a
    "hot" request of a prompt longer than ``max_model_len``, refused at once by the replica
    (with the front's check off, below): counted, the hot revision is most of the routed tokens
    (a share of about 0.6)."""
    trace = []
    for i in range(200):
        trace.append(TraceRecord(i * 0.1, "tail", f"t{i % 10}", 200, 8))
        if i % 2 == 0:
            trace.append(TraceRecord(i * 0.1 + 0.05, "hot", "h", 600, 8))
    return trace


def test_a_request_refused_before_its_first_token_is_uncounted_from_the_topology(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the fleet's engine client withdraws a request that ends without a first token
    (``routing.UNADMITTED``), the simulator uncounts it from the real ``FleetTopology``: a
    tenant's refused requests dedicate no replica (counted, they made the hot revision half
    the window's tokens, a replica's worth on two replicas). The front refuses these prompts
    before routing (``sim/refusal.py``; then nothing reaches the topology at all): turned off
    here, they reach the replica, whose engine refuses them (``PromptTooLongError``), as it
    would any request refused after routing."""
    asks: list[tuple[str, str | None]] = []
    monkeypatch.setattr(fleet.SimFleetRouter, "_ask", lambda self, r, k: asks.append((r, k)))
    config = SimConfig(replicas=2, max_model_len=512, topology=TopologyConfig(window_s=5.0))
    at_front: list[Outcome] = []
    simulate(_refused_hot_trace(), config, cost(), keep_outcomes=at_front)
    assert {o.refused for o in at_front if o.tenant == "hot"} == {"context_length_exceeded"}
    monkeypatch.setattr(run, "refusal", lambda record, max_model_len: None)
    outcomes: list[Outcome] = []
    simulate(_refused_hot_trace(), config, cost(), keep_outcomes=outcomes)
    hot = [o for o in outcomes if o.tenant == "hot"]
    assert hot and all(o.error == "PromptTooLongError" and o.replica >= 0 for o in hot)
    assert all(o.first_token_s is None for o in hot)
    assert all(o.ok for o in outcomes if o.tenant == "tail")
    assert asks == []
