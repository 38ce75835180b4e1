"""The router's one frozen config; every key and its default is documented in docs/router.md."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True)
class RouterConfig:
    """Weights, thresholds and bounds of the replica choice.

    A replica's score for a request is its residency weight for the revision (plus the pinned
    and merged bonuses) minus its load penalty; the weights are ordered GPU ≫ loading > CPU >
    disk > absent.
    """

    weight_l0: float = 100.0  # revision in the replica's GPU slots
    weight_loading: float = 60.0  # being loaded there, or routed there since its last report
    weight_l1: float = 30.0  # in its CPU tier
    weight_l2: float = 10.0  # on its local disk
    weight_pinned: float = 5.0  # bonus: pinned there, so it will not be evicted under us
    weight_merged: float = 20.0  # bonus: merged into its base weights (its tokens skip LoRA)
    penalty_per_queued: float = 4.0  # per waiting request (for a seat or its adapter; + routed)
    penalty_per_running: float = 1.0  # per running sequence (it shares every engine step)
    penalty_per_1k_active_tokens: float = 1.0  # per 1,000 active tokens (reported + routed)
    penalty_per_eviction_per_min: float = 0.5  # per adapter eviction in the replica's last minute
    max_queued: int = 8  # saturated at this many waiting requests
    max_ongoing: int = 16  # saturated at this many waiting and running requests together
    max_kv_usage: float = 0.9  # saturated at this KV cache usage
    placement_k: int = 2  # replicas a cold revision may go to (its rendezvous-hash top k)
    narrow_below: float = 0.5  # a widened set narrows when the narrower set is below this load
    max_report_age_s: float = 3.0  # older reports count as no report
    recent_ttl_s: float = 10.0  # the router forgets its own decisions after this at the latest
    session_ttl_s: float = 600.0  # a session's replica is forgotten after this long unused
    max_sessions: int = 65536  # sessions remembered (the biggest tenant's LRU dropped first)
    max_tracked_adapters: int = 65536  # widened placements and reaches remembered (LRU)
    # rule 4 with a reach: a revision fills GPU slots on at most its reach (1 at first) of
    # replicas; it spreads to one more only once those stayed saturated this long, and narrows
    # with hysteresis (``narrow_below``). 0: off (rule 4 spreads at the first saturation)
    spread_after_s: float = 0.0

    def __post_init__(self) -> None:
        check_non_negative_numbers(self)
        order = ("weight_l0", "weight_loading", "weight_l1", "weight_l2")
        for higher, lower in itertools.pairwise(order):
            if getattr(self, higher) < getattr(self, lower):
                raise ValueError(
                    f"{higher} {getattr(self, higher)} is invalid; expected >= "
                    f"{lower} ({getattr(self, lower)}): a faster tier never scores lower"
                )
        for name in (
            "max_queued",
            "max_ongoing",
            "placement_k",
            "max_sessions",
            "max_tracked_adapters",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is invalid; expected an integer >= 1")
        if not 0.0 < self.max_kv_usage <= 1.0:
            raise ValueError(f"max_kv_usage {self.max_kv_usage} is invalid; expected in (0, 1]")
        if not self.narrow_below < 1.0:
            raise ValueError(
                f"narrow_below {self.narrow_below} is invalid; expected < 1 (below saturation, "
                "or widening and narrowing would alternate)"
            )
        for name in ("max_report_age_s", "recent_ttl_s", "session_ttl_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")


def check_non_negative_numbers(config: DataclassInstance) -> None:
    """Refuses the first field of ``config`` that is not a finite number >= 0 (a bool is not a
    number here), naming it: the shared first check of the router's numeric configs."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{f.name} {value!r} is invalid; expected a number")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{f.name} {value!r} is invalid; expected a finite number >= 0")
