"""Where ``sim calibrate-fleet``'s contention rounds run (``bench/sim/contention_rounds.place``):
candidates warmed one at a time, each kept only on a replica holding the fewest kept ones, the
rest dropped; on a stand-in fleet and on the simulator's own router."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.bench.sim.contention_fit import RoundShape, warm_replicas
from loraplex.bench.sim.contention_rounds import (
    CANDIDATES_PER_ADAPTER,
    FleetSlots,
    candidates,
    place,
)
from loraplex.bench.workloads import TraceAdapter
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import load

CONFIG = SimConfig(replicas=3, max_loras=4, bytes_per_rank=10_000)


def _shape(adapters: list[TraceAdapter]) -> RoundShape:
    return RoundShape(tuple((a.tenant, a.name, a.rank, 80_000) for a in adapters), 4, 16, 8)


def test_place_keeps_the_fewest_loaded_replica_and_drops_the_rest() -> None:
    pool = candidates("t", 5)
    lands = iter([0, 0, None, 1, 1, 1, 0, 0, 1])
    dropped: list[str] = []
    placed = place(pool, 5, 2, lambda a, kept: next(lands), lambda a: dropped.append(a.name))
    # c0 -> 0 kept; c1 -> 0 dropped (0 holds one, 1 none); c2 unseen, dropped; c3 -> 1 and
    # c4 -> 1 kept (1 held the fewest, tied); c5 -> 1 dropped; c6 -> 0, c7 -> 0 kept; done
    assert [a.name for a in placed.adapters] == ["c0", "c3", "c4", "c6", "c7"]
    assert placed.replicas == [0, 1, 1, 0, 0]
    assert placed.counts(2) == [3, 2]
    assert dropped == placed.skipped == ["c1", "c2", "c5"]


def test_place_stops_short_when_the_pool_runs_out_and_refuses_bad_counts() -> None:
    pool = candidates("t", 1)
    assert len(pool) == CANDIDATES_PER_ADAPTER
    placed = place(pool, 2, 2, lambda a, kept: 0, lambda a: None)
    assert placed.replicas == [0] and len(placed.skipped) == CANDIDATES_PER_ADAPTER - 1
    with pytest.raises(ValueError, match="wanted"):
        place(pool, 0, 2, lambda a, kept: 0, lambda a: None)


def test_fleet_slots_names_the_replica_whose_slot_count_grew() -> None:
    reads = iter([[1, 0, 0], [1, 1, 0], [1, 2, 0], [1, 1, 0], [1, 1, 0], [2, 1, 1]])
    evicted: list[str] = []
    warmed = iter([True, True, True, True])
    slots = FleetSlots(
        lambda a: next(warmed), lambda: next(reads), lambda a: evicted.append(a.name)
    )
    pool = candidates("t", 1)
    assert slots.land(pool[0]) == 1  # [1, 0, 0] -> [1, 1, 0]
    assert slots.land(pool[1]) == 1  # -> [1, 2, 0]
    slots.drop(pool[1])  # evicted, counts read again: [1, 1, 0]
    assert evicted == ["c1"]
    assert slots.land(pool[2]) is None  # nothing grew: [1, 1, 0]
    assert slots.land(pool[3]) is None  # two grew at once: not one replica's


def test_in_the_simulator_the_kept_adapters_sit_one_per_replica() -> None:
    """The simulator's rounds are placed by the same rule over its own router: its warm-up then
    leaves one kept adapter on each replica (where c0, c1, c2 taken in order need not)."""
    model = load(Path(__file__).resolve().parents[1] / "sim" / "cost_example.json")
    pool = candidates("t", 3)

    def land(adapter: TraceAdapter, kept: list[TraceAdapter]) -> int:
        return warm_replicas(model, CONFIG, _shape([*kept, adapter]))[-1]

    placed = place(pool, 3, 3, land, lambda a: None)
    assert sorted(placed.replicas) == [0, 1, 2]
    assert sorted(warm_replicas(model, CONFIG, _shape(placed.adapters))) == [0, 1, 2]
