"""The baselines (pow2, ray_multiplex), the policy registry and determinism under a seed."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from router_kit import make_router, report, req

from loraplex.clock import ManualClock
from loraplex.router import Reason, Router, RouterConfig, policy_names, register_policy
from loraplex.router.baselines import Pow2Policy

A = "t/a@1"


def test_policy_names_and_registry_errors() -> None:
    assert policy_names() == ("affinity", "affinity_until_saturated", "pow2", "ray_multiplex")
    with pytest.raises(ValueError, match="already registered"):
        register_policy("pow2", Pow2Policy)
    with pytest.raises(ValueError, match="policy_name 'nope' is unknown"):
        Router("nope", clock=ManualClock(), rng=random.Random(0))


def test_default_policy_is_affinity_until_saturated() -> None:
    router = Router(clock=ManualClock(), rng=random.Random(0))
    assert router.policy.name == "affinity_until_saturated"
    assert router.config == RouterConfig()


def test_pow2_picks_the_less_loaded_of_two_and_ignores_residency() -> None:
    chosen = set()
    for seed in range(30):
        router, _ = make_router("pow2", seed=seed)
        fleet = {"gpu": report("gpu", l0=[A], queued=1), "idle": report("idle")}
        decision = router.choose(req(), fleet)
        assert (decision.replica_id, decision.reason) == ("idle", Reason.POW2)
        three = {
            "a": report("a", queued=1),
            "b": report("b", queued=2, running=1),
            "c": report("c", running=5),
        }
        chosen.add(make_router("pow2", seed=seed)[0].choose(req(), three).replica_id)
    # Of three, the most loaded is never chosen (it loses either draw it is in).
    assert chosen == {"a", "b"}


def test_pow2_counts_its_own_decisions_as_load() -> None:
    router, _ = make_router("pow2")
    fleet = {"a": report("a"), "b": report("b")}
    picks = [router.choose(req(), fleet).replica_id for _ in range(4)]
    assert sorted(picks) == ["a", "a", "b", "b"]


def test_ray_multiplex_prefers_a_replica_with_the_model_loaded() -> None:
    router, _ = make_router("ray_multiplex")
    fleet = {"cpu": report("cpu", l1=[A], queued=5), "idle": report("idle")}
    decision = router.choose(req(), fleet)
    assert (decision.replica_id, decision.reason) == ("cpu", Reason.MULTIPLEX)


def test_ray_multiplex_falls_back_to_the_fewest_models_when_holders_are_full() -> None:
    for seed in range(10):
        router, _ = make_router("ray_multiplex", seed=seed)
        fleet = {
            "full": report("full", l0=[A], queued=8),
            "many": report("many", l0=["t/x@1", "t/y@1"]),
            "few": report("few", l0=["t/z@1"], queued=3),
        }
        decision = router.choose(req(), fleet)
        assert (decision.replica_id, decision.reason) == ("few", Reason.POW2)


def test_ray_multiplex_does_not_treat_its_decisions_as_residency() -> None:
    router, _ = make_router("ray_multiplex")
    fleet = {"a": report("a"), "b": report("b")}
    first = router.choose(req("t/cold@1"), fleet)
    second = router.choose(req("t/cold@1"), fleet)
    # Only reported residency counts as "loaded"; the pending request is load, so it moves.
    assert (first.reason, second.reason) == (Reason.POW2, Reason.POW2)
    assert first.replica_id != second.replica_id


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(policy_names()),
    queued=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    resident=st.lists(st.sampled_from(["", "l0", "l1", "l2"]), min_size=6, max_size=6),
    adapter=st.sampled_from([None, A]),
    seed=st.integers(0, 3),
)
def test_every_decision_ranks_every_replica_once_and_is_reproducible(
    policy: str, queued: list[int], resident: list[str], adapter: str | None, seed: int
) -> None:
    def held(i: int, tier: str) -> list[str]:
        return [A] if resident[i] == tier else []

    fleet = {
        f"r{i}": report(f"r{i}", queued=q, l0=held(i, "l0"), l1=held(i, "l1"), l2=held(i, "l2"))
        for i, q in enumerate(queued)
    }
    runs = []
    for _ in range(2):
        router, _ = make_router(policy, seed=seed)
        runs.append([router.choose(req(adapter, session="s"), fleet) for _ in range(3)])
    assert runs[0] == runs[1]
    for decision in runs[0]:
        assert sorted(decision.ranked) == sorted(fleet)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"weight_l1": 200.0}, "weight_loading"),
        ({"max_queued": 0}, "max_queued"),
        ({"max_ongoing": 0}, "max_ongoing"),
        ({"penalty_per_running": -1.0}, "penalty_per_running"),
        ({"max_kv_usage": 0.0}, "max_kv_usage"),
        ({"narrow_below": 1.0}, "narrow_below"),
        ({"penalty_per_queued": -1.0}, "penalty_per_queued"),
        ({"recent_ttl_s": float("inf")}, "recent_ttl_s"),
        ({"placement_k": 1.5}, "placement_k"),
        ({"max_sessions": True}, "max_sessions"),
    ],
)
def test_config_refuses_bad_values_naming_the_key(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        RouterConfig(**changes)  # type: ignore[arg-type]


def test_sessions_are_bounded() -> None:
    router, _ = make_router(max_sessions=2)
    fleet = {"a": report("a"), "b": report("b")}
    for session in ("s1", "s2", "s3"):
        router.choose(req(None, session=session), fleet)
    # s1 was dropped (least recently used): it no longer sticks.
    assert router.choose(req(None, session="s3"), fleet).reason is Reason.SESSION
    assert router.choose(req(None, session="s1"), fleet).reason is Reason.POW2
