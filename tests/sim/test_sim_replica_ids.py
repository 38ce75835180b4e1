"""A fleet's replica names set where its cold revisions go (docs/simulator.md, "simfleet",
"simrank"): the router places a revision resident nowhere by hashing its key with the replicas'
names. A real fleet's router names them by deployment rank (``rank-0``, .., the simulator's
default); ``simulate`` takes others (the random ids Ray Serve draws, which it placed by before)."""

from __future__ import annotations

from collections import Counter

import pytest
from sim_inputs import cost, scenario

from loraplex.router.placement import rank_name, rendezvous_order
from loraplex.sim.config import SimConfig
from loraplex.sim.names import MAX_REPLICA_ID_CHARS
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import adapter_key, simulate
from loraplex.sim.trace import TraceRecord

RAY_LIKE = ("tjn04uo6", "ka6u02iy", "av6j9phv")


def _spaced() -> list[TraceRecord]:
    """Twelve adapters asked once each, far apart: every decision finds the fleet idle, so each
    is a placement on the first replica of the revision's rendezvous order."""
    return [TraceRecord(5.0 * i, "t", f"a{i}", 8, 2) for i in range(12)]


def _first_of_order(ids: tuple[str, ...]) -> list[str]:
    return [rendezvous_order(str(adapter_key("t", f"a{i}")), list(ids))[0] for i in range(12)]


@pytest.mark.parametrize("ids", [None, RAY_LIKE])
def test_each_cold_revision_goes_first_where_its_order_over_the_ids_says(
    ids: tuple[str, ...] | None,
) -> None:
    names = ids or tuple(rank_name(i) for i in range(3))
    kept: list[Outcome] = []
    result = simulate(_spaced(), SimConfig(replicas=3), cost(), keep_outcomes=kept, replica_ids=ids)
    assert result.metrics["decisions"] == {"placement": 12}
    assert [names[o.replica] for o in kept] == _first_of_order(names)


def test_other_ids_place_the_same_trace_otherwise() -> None:
    def placed(ids: tuple[str, ...] | None) -> list[int]:
        kept: list[Outcome] = []
        simulate(_spaced(), SimConfig(replicas=3), cost(), keep_outcomes=kept, replica_ids=ids)
        return [o.replica for o in kept]

    assert _first_of_order(RAY_LIKE) != [RAY_LIKE[i] for i in placed(None)]
    assert placed(RAY_LIKE) != placed(None)


def test_the_simulators_own_names_given_change_nothing() -> None:
    trace = scenario("zipf-longtail", duration_s=10)
    config = SimConfig(replicas=3, max_loras=4)
    own = tuple(rank_name(i) for i in range(3))  # the real fleet's router's names too
    assert (
        simulate(trace, config, cost(), replica_ids=own).to_json()
        == simulate(trace, config, cost()).to_json()
    )


def test_a_fleets_hit_ratio_moves_with_its_replica_ids_alone() -> None:
    """The figure ``bench sim --fleet-id-draws`` averages: the same trace, deployment and cost,
    only the ids differ, and the L0/L1 split moves while the cold share does not."""
    trace = scenario("zipf-longtail", duration_s=20, rate=4.0)
    config = SimConfig(replicas=3, max_loras=2, cpu_adapter_bytes=1 << 30)
    draws = [("a", "b", "c"), ("x1", "y2", "z3"), RAY_LIKE, ("p", "q", "r"), ("m", "n", "o")]
    ratios = [
        simulate(trace, config, cost(), replica_ids=ids).metrics["hit_ratio"] for ids in draws
    ]
    assert len({r["L0"] for r in ratios}) > 1
    assert Counter(r["L3"] for r in ratios).most_common(1)[0][1] >= 3


@pytest.mark.parametrize(
    ("ids", "words"),
    [
        (("a", "b"), "has 2 ids; expected one per replica (3)"),
        (("a", "b", "a"), "expected distinct ids"),
        (("a", "", "c"), "expected a string of 1 to"),
        (("a", "b", "c" * (MAX_REPLICA_ID_CHARS + 1)), "expected a string of 1 to"),
    ],
)
def test_replica_ids_are_refused_by_name(ids: tuple[str, ...], words: str) -> None:
    with pytest.raises(ValueError, match="replica_ids") as refused:
        simulate(_spaced(), SimConfig(replicas=3), cost(), replica_ids=ids)
    assert words in str(refused.value)
