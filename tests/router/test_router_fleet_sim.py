"""A seeded Zipf stream over a simulated fleet (replicas with a few LRU slots and a work
backlog): ``affinity_until_saturated`` gets a higher L0 hit ratio than ``pow2`` and never sends
a request to a saturated replica while an unsaturated one holds the revision."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from router_kit import ToyReplica, make_router, req

from loraplex.router import ReplicaReport, ReplicaView, RouterConfig
from loraplex.router.view import is_saturated

NUM_REPLICAS = 4
NUM_SLOTS = 4  # L0 slots per replica
NUM_ADAPTERS = 64
CAPACITY_PER_TICK = 10.0  # work units a replica finishes per 1 s tick
MISS_COST = 2.0  # a cold request costs this many units (the load), a hit costs 1
ARRIVALS_PER_TICK = 16
NUM_TICKS = 120


def _zipf_stream(seed: int) -> list[str]:
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(NUM_ADAPTERS)]
    keys = [f"tenant/adapter-{i}@r1" for i in range(NUM_ADAPTERS)]
    return rng.choices(keys, weights, k=ARRIVALS_PER_TICK * NUM_TICKS)


@dataclass
class Outcome:
    hits: int = 0
    saturated_choices_with_open_holder: int = 0
    decisions_with_a_saturated_replica: int = 0


def _run(policy: str, seed: int) -> Outcome:
    router, clock = make_router(policy, seed=seed, max_queued=6)
    replicas = {
        f"r{i}": ToyReplica(f"r{i}", NUM_SLOTS, CAPACITY_PER_TICK, MISS_COST)
        for i in range(NUM_REPLICAS)
    }
    reports: dict[str, ReplicaReport | None] = {r: s.tick(0.0) for r, s in replicas.items()}
    outcome = Outcome()
    stream = _zipf_stream(seed)
    for tick in range(NUM_TICKS):
        for key in stream[tick * ARRIVALS_PER_TICK : (tick + 1) * ARRIVALS_PER_TICK]:
            clock.advance(1.0 / ARRIVALS_PER_TICK)
            before = router.view(reports)
            chosen = router.choose(req(key), reports).replica_id
            _check(before, router.config, key, chosen, outcome)
            outcome.hits += replicas[chosen].serve(key)
        reports = {r: s.tick(clock.now()) for r, s in replicas.items()}
    return outcome


def _check(
    before: list[ReplicaView], config: RouterConfig, key: str, chosen: str, out: Outcome
) -> None:
    """Counts choices of a saturated replica while an unsaturated one reports the revision in
    L0, judged on ``before``: what ``choose`` saw (the same instant, the same memory)."""
    saturated = {v.replica_id for v in before if is_saturated(v, config)}
    out.decisions_with_a_saturated_replica += bool(saturated)
    open_holders = {
        v.replica_id
        for v in before
        if v.replica_id not in saturated and v.report is not None and key in v.report.residency.l0
    }
    if chosen in saturated and open_holders:
        out.saturated_choices_with_open_holder += 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_affinity_until_saturated_beats_pow2_on_l0_hits_and_respects_saturation(seed: int) -> None:
    default = _run("affinity_until_saturated", seed)
    pow2 = _run("pow2", seed)
    # About 0.50 against 0.24 on these seeds: 1.5x leaves room for small model changes.
    assert default.hits >= 1.5 * pow2.hits > 0
    assert default.decisions_with_a_saturated_replica > 0  # the rule was exercised
    assert default.saturated_choices_with_open_holder == 0
