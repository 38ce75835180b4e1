"""loraplex's policies: ``affinity`` (residency alone) and ``affinity_until_saturated``.

``affinity_until_saturated`` decides in this order, first match wins:

1. session: the session's last replica, while it is not saturated (its KV prefix is there);
2. base model (no revision): power of two choices among the unsaturated replicas;
3. residency: the best-scoring unsaturated replica holding the revision (L0, loading, L1, L2;
   score = residency weight − load penalty; a replica that merged it into its base weights
   gets ``weight_merged`` on top of L0, reason ``merged``);
4. saturated: some replica holds it but all such are saturated — load wins: the least loaded
   unsaturated replica (it becomes a new holder, so a revision past one replica's capacity
   spreads); when every replica is saturated, the best score over all of them;

   with ``spread_after_s`` > 0 (off by default), a *reach* comes before rules 3 and 4: a
   revision fills GPU slots (L0 or loading) on at most its reach of replicas, 1 at first. Once
   it fills that many, rules 3 and 4 see only those (the first ``reach`` of them in its
   rendezvous order): an open one by score (rule 3's reason), else it waits at the best one
   (``reach_full``) instead of loading into another replica's slots. The reach widens by one
   once those stayed saturated for ``spread_after_s`` while some replica is open (the next
   decision is then rule 4's ``saturated``), and narrows by one once their load would fit on
   one replica fewer below ``narrow_below`` for as long (``placement.Reaches``): a revision
   below one replica's capacity stays on one holder, one above it spreads as far as it must;
5. placement: resident nowhere — the best unsaturated replica of its rendezvous set (widened
   while the whole set is saturated, narrowed with hysteresis).

A replica dedicated to another revision (``Router.dedication``, ``router/topology.py``) takes no
cold load of this one (rules 3-5 where it does not hold it in GPU slots: an L1 or L2 copy
there, a new holder, a placement) while any other replica is unsaturated: it is left out of
those rules (rule 5 counts it saturated, so a set holding it widens past it). When every other
replica is saturated it may take one, reason ``dedicated_spill``. Without a dedication nothing
changes.

Replicas without a fresh report rank after every replica with one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from loraplex.router.config import RouterConfig
from loraplex.router.decision import (
    Decision,
    Reason,
    RouteRequest,
    decision,
    lazy_decision,
    no_report,
    pow2,
)
from loraplex.router.placement import PlacementWidths, Reaches, rendezvous_order
from loraplex.router.sessions import SessionTable
from loraplex.router.view import (
    FleetScan,
    ReplicaView,
    Tier,
    affinity,
    holder_rank,
    load_penalty,
    load_rank,
    utilization,
)

_HIT_REASON = {
    Tier.L0: Reason.GPU_HIT,
    Tier.LOADING: Reason.PLACEMENT,
    Tier.L1: Reason.CPU_HIT,
    Tier.L2: Reason.DISK_HIT,
    Tier.ABSENT: Reason.PLACEMENT,
}


def _hit_reason(view: ReplicaView, key: str) -> Reason:
    tier = view.tier_of(key)
    return Reason.MERGED if tier is Tier.L0 and view.is_merged(key) else _HIT_REASON[tier]


def _least_loaded(views: Sequence[ReplicaView], config: RouterConfig) -> ReplicaView:
    return min(views, key=lambda v: (load_penalty(v, config), v.replica_id))


class AffinityPolicy:
    """Pure residency: the fastest tier wins whatever the load (load only breaks ties). The
    baseline that shows why saturation must override affinity: one replica gets every hot
    revision's traffic.

    A replica dedicated to another revision that does not hold this one in GPU slots ranks
    after every other known replica (it takes no cold load of it, as under
    ``affinity_until_saturated``; with no saturation rule here, it takes one only when no other
    replica has a report: reason ``dedicated_spill``)."""

    name = "affinity"
    # RouterConfig fields it reads: the residency weights and the load penalties (no saturation
    # bound, placement, reach or session key)
    reads = frozenset(
        {
            "weight_l0",
            "weight_loading",
            "weight_l1",
            "weight_l2",
            "weight_pinned",
            "weight_merged",
            "penalty_per_queued",
            "penalty_per_running",
            "penalty_per_1k_active_tokens",
            "penalty_per_eviction_per_min",
        }
    )

    def __init__(self, config: RouterConfig, rng: random.Random) -> None:
        self._config = config
        self._rng = rng

    def rank(self, request: RouteRequest, fleet: Sequence[ReplicaView], now_s: float) -> Decision:
        key = request.adapter_key
        known = [v for v in fleet if v.known]
        if not known:
            return no_report(fleet, self._rng)
        if key is None:
            return decision(pow2(known, self._rng), fleet, Reason.POW2)
        order = sorted(
            known,
            key=lambda v: (-affinity(v, key, self._config), load_penalty(v, self._config)),
        )
        kept = next((v for v in known if v.dedicated not in (None, key)), None)
        if kept is not None and kept.tier_of(key) < Tier.LOADING:
            order.remove(kept)
            order.append(kept)  # last: no cold load of ``key`` on it while another can take it
            if order[0] is kept:
                return decision(order, fleet, Reason.DEDICATED_SPILL)
        return decision(order, fleet, _hit_reason(order[0], key))


class AffinityUntilSaturatedPolicy:
    """Residency first until a replica is saturated, then load (the module docstring)."""

    name = "affinity_until_saturated"

    def __init__(self, config: RouterConfig, rng: random.Random) -> None:
        self._config = config
        self._rng = rng
        self._sessions = SessionTable(config.session_ttl_s, config.max_sessions)
        self._widths = PlacementWidths(
            config.placement_k, config.narrow_below, config.max_tracked_adapters
        )
        self._scan = FleetScan(config)
        self._reaches = (
            Reaches(config.spread_after_s, config.narrow_below, config.max_tracked_adapters)
            if config.spread_after_s > 0
            else None
        )

    def rank(self, request: RouteRequest, fleet: Sequence[ReplicaView], now_s: float) -> Decision:
        scan = self._scan
        scan.update(fleet)
        known = scan.known()
        if not known:
            return no_report(fleet, self._rng)
        key, config = request.adapter_key, self._config
        # Each replica's rank is (saturated, -score, id). Where the revision is absent -score is
        # the load penalty, which ``load_rank`` remembers per view; the holders' are made here,
        # once for the pick and the ranking both (and remembered by the view, ``holder_rank``).
        holding: dict[ReplicaView, tuple[bool, float, str]] = {}
        if key is not None:
            for v in scan.holders(key):
                holding[v] = holder_rank(v, key, config)
        chosen, reason = self._pick(request, known, scan.open(), holding, now_s)
        if request.session_key is not None:
            self._sessions.put(request.session_key, chosen.replica_id, now_s, request.tenant)

        def by_score() -> list[ReplicaView]:
            return sorted(
                (v for v in known if v is not chosen),
                key=lambda v: holding.get(v) or load_rank(v, config),
            )

        return lazy_decision(chosen, by_score, fleet, reason)

    def _pick(
        self,
        request: RouteRequest,
        known: list[ReplicaView],
        open_: list[ReplicaView],
        holding: dict[ReplicaView, tuple[bool, float, str]],
        now_s: float,
    ) -> tuple[ReplicaView, Reason]:
        """Rules 1-5 of the module docstring; ``open_``: the unsaturated ``known`` replicas;
        ``holding``: the ``known`` replicas that hold the revision anywhere (``holders``), each
        with its (saturated, -score, id)."""
        if request.session_key is not None:
            replica_id = self._sessions.get(request.session_key, now_s)
            for view in open_:
                if view.replica_id == replica_id:
                    return view, Reason.SESSION
        key = request.adapter_key
        if key is None:
            return pow2(open_ or known, self._rng)[0], Reason.POW2
        kept = self._scan.dedicated_to_another(key)
        if kept is None or kept.tier_of(key) >= Tier.LOADING:
            return self._by_residency(key, known, open_, holding, now_s)
        if any(v is not kept for v in open_):  # another replica can take it: not ``kept``
            open_ = [v for v in open_ if v is not kept]
            holding = {v: rank for v, rank in holding.items() if v is not kept}
            return self._by_residency(key, known, open_, holding, now_s, kept=kept)
        chosen, reason = self._by_residency(key, known, open_, holding, now_s)
        return chosen, Reason.DEDICATED_SPILL if chosen is kept else reason

    def _by_residency(
        self,
        key: str,
        known: list[ReplicaView],
        open_: list[ReplicaView],
        holding: dict[ReplicaView, tuple[bool, float, str]],
        now_s: float,
        *,
        kept: ReplicaView | None = None,
    ) -> tuple[ReplicaView, Reason]:
        """Rules 3-5 for ``key``; ``kept``: a replica dedicated to another revision that must
        not load ``key`` (left out of ``open_`` and ``holding`` already), or None."""
        config = self._config
        within = self._within_reach(key, known, open_, holding, now_s)
        if within is not None:
            holding = within
        open_holders = [v for v, (saturated, _, _) in holding.items() if not saturated]
        if open_holders:
            best = min(open_holders, key=lambda v: holding[v][1:])
            return best, _hit_reason(best, key)
        if within is not None:  # its reach is full and saturated, not for long enough: wait
            return min(holding, key=lambda v: holding[v][1:]), Reason.REACH_FULL
        if holding:
            if open_:
                return _least_loaded(open_, config), Reason.SATURATED

            # Every replica is saturated: no move buys capacity, and the least loaded one would
            # take a load and evict for it, so the score (residency minus load) decides. A
            # holder's -score is in ``holding``; a replica that does not hold the revision scores
            # 0 - load_penalty, so its (-score, id) is its ``load_rank`` less the first.
            def by_score(v: ReplicaView) -> tuple[float, str]:
                held = holding.get(v)
                rank = held if held is not None else load_rank(v, config)
                return rank[1], rank[2]

            return min(known, key=by_score), Reason.SATURATED
        return self._place(key, known, kept)

    def _within_reach(
        self,
        key: str,
        known: list[ReplicaView],
        open_: list[ReplicaView],
        holding: dict[ReplicaView, tuple[bool, float, str]],
        now_s: float,
    ) -> dict[ReplicaView, tuple[bool, float, str]] | None:
        """The holders rules 3 and 4 may use while ``key`` fills slots on its whole reach (the
        module docstring): the first ``reach`` of those in its rendezvous order, with their
        ranks; None while it may spread (fewer fill slots, or its reach just widened) or the
        reach is off."""
        reaches = self._reaches
        if reaches is None:
            return None
        reach = reaches.reach(key)
        filling = [v for v in holding if v.tier_of(key) >= Tier.LOADING]
        if len(filling) < reach:
            return None
        order = rendezvous_order(key, [v.replica_id for v in known])
        rank = {r: i for i, r in enumerate(order)}
        kept = sorted(filling, key=lambda v: rank[v.replica_id])[:reach]
        config = self._config
        can_widen = any(v not in kept for v in open_)
        now = reaches.update(
            key, [utilization(v, config) for v in kept], now_s, can_widen=can_widen
        )
        if now > reach:
            return None
        return {v: holding[v] for v in kept[:now]}

    def _place(
        self, key: str, known: list[ReplicaView], kept: ReplicaView | None = None
    ) -> tuple[ReplicaView, Reason]:
        """A revision resident nowhere: the best unsaturated replica of its rendezvous set;
        ``kept`` (a replica dedicated to another revision) counts as saturated and is never
        chosen."""
        config = self._config
        by_id = {v.replica_id: v for v in known}
        order = rendezvous_order(key, list(by_id))

        def load(replica_id: str) -> float:
            view = by_id[replica_id]
            value = utilization(view, config, cold=True)
            return value if view is not kept else max(value, 1.0)

        width = self._widths.update(key, order, load)
        candidates = [by_id[r] for r in order[:width] if load(r) < 1.0]
        if not candidates:  # the set spans the fleet and every replica is saturated
            others = [v for v in known if v is not kept]
            return _least_loaded(others, config), Reason.SATURATED
        # Least loaded; ties go to the earlier replica of the rendezvous order.
        best = min(candidates, key=lambda v: load_penalty(v, config))
        return best, Reason.PLACEMENT if width <= config.placement_k else Reason.WIDENED
