"""A simulated replica's routing report keeps its ready sets from the cache's change log
(``sim/fleet.py``); every report must hold the sets a walk of every cached copy gives (the way
the reports were built before, and ``fleet.replica.routing_report`` builds them from a
snapshot)."""

from __future__ import annotations

from collections import Counter

import pytest
from sim_inputs import cost

from loraplex.residency.cache import ResidencyChanges
from loraplex.residency.ledger import Tier
from loraplex.router import ReplicaReport, Residency
from loraplex.sim import fleet
from loraplex.sim.config import SimConfig
from loraplex.sim.replica import SimReplica
from loraplex.sim.run import adapter_key, simulate
from loraplex.sim.scale import synthetic_trace


def walked(replica: SimReplica) -> Residency:
    """The sets from every copy of every cached tier (the reports' former path)."""
    tiers: dict[Tier, set[str]] = {Tier.L0: set(), Tier.L1: set(), Tier.L2: set()}
    loading: set[str] = set()
    pinned: set[str] = set()
    for tier, ledger in replica.cache.ledgers.items():
        for key, entry in ledger.entries.items():
            if entry.ready:
                tiers[tier].add(str(key))
            elif tier is Tier.L0:
                loading.add(str(key))
            if entry.pinned:
                pinned.add(str(key))
    return Residency(
        l0=frozenset(tiers[Tier.L0]),
        l1=frozenset(tiers[Tier.L1]),
        l2=frozenset(tiers[Tier.L2]),
        loading=frozenset(loading),
        pinned=frozenset(pinned),
    )


def test_every_report_holds_the_sets_a_walk_of_every_copy_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: Counter[str] = Counter()
    report = fleet.SimFleetRouter._report

    def checked(self: fleet.SimFleetRouter, replica: SimReplica, now_s: float) -> ReplicaReport:
        made = report(self, replica, now_s)
        assert made.residency == walked(replica)
        seen["reports"] += 1
        for part in ("loading", "pinned", "l1", "l2"):
            seen[part] += bool(getattr(made.residency, part))
        return made

    monkeypatch.setattr(fleet.SimFleetRouter, "_report", checked)
    # Small L1 and L2 budgets (a few rank-64 copies each) over many adapters: copies come and go
    # in every tier; automatic warm rebalancing every second pins the hot ones.
    config = SimConfig(
        replicas=4,
        max_loras=4,
        cpu_adapter_bytes=12 << 20,
        disk_cache_bytes=32 << 20,
        auto_warm_interval_s=1.0,
        report_interval_s=0.1,
    )
    result = simulate(synthetic_trace(1500, 120, 40.0 * 4, seed=2), config, cost())
    evictions = result.metrics["evictions"]
    assert evictions["L1"] > 0 and evictions["L2"] > 0, evictions
    assert seen["reports"] > 100
    assert min(seen["loading"], seen["pinned"], seen["l1"], seen["l2"]) > 0, seen


def test_a_whole_map_from_the_change_log_replaces_the_sets() -> None:
    """A reader further behind than the bounded change log gets the whole map (``full``):
    what it held before and the map no longer names is gone."""
    a, b = (adapter_key("t", name) for name in ("a", "b"))
    ready = fleet._ReadySets()
    ready.update(ResidencyChanges(3, {a: (Tier.L0, Tier.L2), b: (Tier.L1,)}, full=True), str)
    assert (ready.version, ready.frozen[Tier.L0], ready.frozen[Tier.L1]) == (
        3,
        frozenset({str(a)}),
        frozenset({str(b)}),
    )
    ready.update(ResidencyChanges(9, {b: (Tier.L2,)}, full=True), str)
    assert ready.frozen == {Tier.L0: frozenset(), Tier.L1: frozenset(), Tier.L2: {str(b)}}
    ready.update(ResidencyChanges(10, {a: (Tier.L1,), b: ()}, full=False), str)
    assert ready.frozen == {Tier.L0: frozenset(), Tier.L1: {str(a)}, Tier.L2: frozenset()}
    assert ready.version == 10
