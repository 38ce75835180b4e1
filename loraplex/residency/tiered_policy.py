"""``tiered_gdsf``: ``admit_gdsf`` in L0, and in the byte tiers (L1, L2) a copy valued by the
requests that actually read it.

Torch-free (the simulator and the replays reuse it). ``admit_gdsf`` ranks an L1 or L2 copy by
its adapter's request rate, but a request served from a GPU slot never reads the CPU copy: a
hot adapter that lives in L0 keeps a CPU copy nobody reads, and a tail adapter that misses L0 on
every request reads its CPU copy every time. What a copy in tier k saves is one refill per
request that missed every faster tier (the cache counts them: ``Candidate.reads``). So, in L1
and L2:

- **keep = priority x reads (5-minute rate) / size_bytes**: refills saved per second and per
  byte held, GDSF's frequency over size with the tier's own hit count as the frequency. Reload
  cost is left out on purpose: every miss there is one reload whatever its bytes, and the fixed
  stall in ``reload_cost_s`` made admit_gdsf keep large copies that save fewer misses per byte.
  No staleness cap and no recency bonus: a tail adapter reads L1 once a minute or less, and the
  5-minute counter is the shortest window that still sees it.
- Probation (one-offs first), ghost entries (request history outlives residency), the optional
  loads' hysteresis and the bounded deferral are admit_gdsf's, unchanged; so is all of L0.

The cache keeps copies of a key in several tiers at once (fills go one tier at a time), so
valuing a lower copy by its reads makes the tiers nearly exclusive where that pays: the CPU copy
of an adapter that stays in a GPU slot decays to the front of L1's victims, while the copy of an
adapter that keeps falling out of L0 stays.
"""

from __future__ import annotations

from loraplex.residency.admit_policy import AdmitGdsfPolicy
from loraplex.residency.ledger import Tier
from loraplex.residency.policy_base import Candidate


class TieredGdsfPolicy(AdmitGdsfPolicy):
    """admit_gdsf whose L1 and L2 keep counts the tier's own reads per byte."""

    name = "tiered_gdsf"

    def keep_score(self, c: Candidate, now_s: float) -> float:
        if c.reads is None:  # L0 (or a caller that does not know the tier's reads)
            return super().keep_score(c, now_s)
        return c.priority * c.reads.per_5m / max(1, c.size_bytes)


class TieredGdsfFetchPolicy(TieredGdsfPolicy):
    """tiered_gdsf whose L2 keep weighs the remote fetch a miss there costs.

    An L2 miss refetches from the remote store, whose time grows with the adapter's bytes (at
    100 MB/s a 20 MB adapter takes about 0.2 s, a 1 MB one 0.01 s beside the fixed 20 ms stall),
    so in L2 the keep is GDSF's refill seconds saved per byte held: **priority x reads (5-minute
    rate) x reload_cost_s / size_bytes**. tiered_gdsf's misses per byte sends the large adapters
    to the remote store (fewest misses, but the slowest ones: on drift they set every tenant's
    P99 wait); this keeps more of them on disk at the price of more, cheaper, small misses. L1
    (refilled from the local disk, where the fixed stall dominates) and L0 are tiered_gdsf's.
    """

    name = "tiered_gdsf_fetch"

    def keep_score(self, c: Candidate, now_s: float) -> float:
        keep = super().keep_score(c, now_s)
        return keep * c.reload_cost_s if c.reads is not None and c.tier is Tier.L2 else keep
