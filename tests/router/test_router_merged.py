"""A replica that merged a revision into its base weights (docs/modes.md) is preferred for that
revision's requests (reason ``merged``), only for that revision, and never past saturation."""

from __future__ import annotations

import pytest
from router_kit import make_router, report, req

from loraplex.router import Reason, RouterConfig

HOT, OTHER = "t/hot@1", "t/other@1"


@pytest.mark.parametrize("policy", ["affinity_until_saturated", "affinity"])
def test_a_replica_merged_for_the_revision_wins_over_plain_gpu_holders(policy: str) -> None:
    fleet = {
        "a": report("a", l0=[HOT, OTHER]),
        "merged": report("merged", l0=[HOT, OTHER], merged=[HOT], running=3),
        "c": report("c", l0=[HOT, OTHER]),
    }
    router, _ = make_router(policy)
    decision = router.choose(req(HOT), fleet)
    assert (decision.replica_id, decision.reason) == ("merged", Reason.MERGED)
    # Another revision gets no bonus there (it pays the negative pass): a plain holder wins.
    router, _ = make_router(policy)
    decision = router.choose(req(OTHER), fleet)
    assert decision.replica_id != "merged" and decision.reason is Reason.GPU_HIT


def test_the_merged_bonus_is_a_weight_and_load_can_outweigh_it() -> None:
    fleet = {
        "merged": report("merged", l0=[HOT], merged=[HOT], queued=3),  # penalty 12 > 0 bonus
        "b": report("b", l0=[HOT]),
    }
    router, _ = make_router(weight_merged=0.0)
    assert router.choose(req(HOT), fleet).replica_id == "b"
    router, _ = make_router(weight_merged=20.0)
    assert router.choose(req(HOT), fleet).reason is Reason.MERGED


def test_a_saturated_merged_replica_is_not_chosen() -> None:
    fleet = {"merged": report("merged", l0=[HOT], merged=[HOT], queued=8), "b": report("b")}
    router, _ = make_router(max_queued=8)
    decision = router.choose(req(HOT), fleet)
    assert decision.replica_id == "b" and decision.reason is Reason.SATURATED


def test_a_merged_key_outside_l0_earns_nothing() -> None:
    """A report naming a merged revision it does not hold in GPU slots is inconsistent: only the
    tier counts."""
    fleet = {"odd": report("odd", l1=[HOT], merged=[HOT]), "b": report("b", l0=[HOT])}
    router, _ = make_router()
    assert router.choose(req(HOT), fleet).replica_id == "b"


def test_weight_merged_is_validated_naming_it() -> None:
    with pytest.raises(ValueError, match="weight_merged -1"):
        RouterConfig(weight_merged=-1.0)
