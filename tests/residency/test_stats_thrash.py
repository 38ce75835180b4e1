"""Reload-after-eviction and thrash counters of ``CacheStats``: a one-off refill after an
eviction is a reload; the same copy evicted and refilled again within the window is thrash."""

from __future__ import annotations

from loraplex.residency.ledger import Tier
from loraplex.residency.stats import AdapterHistory, CacheStats


def _cycle(stats: CacheStats, history: AdapterHistory, tier: Tier, at_s: list[float]) -> None:
    """Fills the copy at ``at_s[0]``, then evicts and refills it at each later instant."""
    stats.record_load(tier, history, at_s[0])
    for now_s in at_s[1:]:
        stats.record_eviction(tier, history, now_s - 0.5)
        stats.record_load(tier, history, now_s)


def test_a_one_off_refill_is_a_reload_not_thrash() -> None:
    stats = CacheStats(reload_window_s=10.0)
    _cycle(stats, AdapterHistory(), Tier.L0, [0.0, 5.0])
    snapshot = stats.snapshot({}, {})
    assert snapshot.reloads_after_eviction[Tier.L0] == 1
    assert snapshot.thrash_events[Tier.L0] == 0


def test_the_same_copy_cycling_within_the_window_counts_thrash_per_tier() -> None:
    stats = CacheStats(reload_window_s=10.0)
    _cycle(stats, AdapterHistory(), Tier.L0, [0.0, 2.0, 4.0, 6.0])
    _cycle(stats, AdapterHistory(), Tier.L1, [0.0, 2.0])
    snapshot = stats.snapshot({}, {})
    assert snapshot.reloads_after_eviction == {Tier.L0: 3, Tier.L1: 1, Tier.L2: 0}
    assert snapshot.thrash_events == {Tier.L0: 2, Tier.L1: 0, Tier.L2: 0}


def test_refills_further_apart_than_the_window_are_not_thrash() -> None:
    stats = CacheStats(reload_window_s=10.0)
    history = AdapterHistory()
    _cycle(stats, history, Tier.L0, [0.0, 5.0, 20.0, 35.0])  # each reload 15 s after the last
    stats.record_eviction(Tier.L0, history, 40.0)
    stats.record_load(Tier.L0, history, 55.0)  # refilled 15 s after its eviction: no reload
    snapshot = stats.snapshot({}, {})
    assert snapshot.reloads_after_eviction[Tier.L0] == 3
    assert snapshot.thrash_events[Tier.L0] == 0
