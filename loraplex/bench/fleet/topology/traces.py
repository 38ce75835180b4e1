"""``bench fleet --topology``'s traces (open loop, Gamma arrivals with cv 1 at one rate for both
sides): ``skewed80``, about 80 % of the tokens on one revision and the rest over 15 others, and
``uniform16``, 16 revisions in turn, both drawn by ``bench modes``' own generator
(``bench.modes.replay.trace``: the same slot draw, prompt length and 8-24 generated tokens) with
the same 16 revisions (ranks 8-64 as in ``bench modes``, the hot one rank 16, every target
module).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from loraplex.bench.fleet.topology.config import (
    HOT_RANK,
    NUM_REVISIONS,
    OUTPUT_TOKENS,
    RANKS,
    TENANT,
    TRACE_SHARES,
)
from loraplex.bench.harness.stats import ratio
from loraplex.bench.workloads import ALL_TARGETS, TraceAdapter, TraceRequest, gamma_arrivals


def revisions() -> tuple[TraceAdapter, ...]:
    """The 16 revisions: ``modes/rev00`` (the hot one, rank 16) .. ``rev15``, ranks cycling
    through 8-64 from the hot one's, every target module (bench modes' ``slot_rank``)."""
    start = RANKS.index(HOT_RANK)
    return tuple(
        TraceAdapter(TENANT, f"rev{i:02d}", RANKS[(start + i) % len(RANKS)], ALL_TARGETS)
        for i in range(NUM_REVISIONS)
    )


def topology_trace(
    name: str, seed: int, rate: float, num_requests: int, prompt_tokens: int
) -> tuple[TraceRequest, ...]:
    """Trace ``name`` at ``rate`` for about ``num_requests`` requests: Gamma (cv 1) arrivals,
    revisions and lengths from ``bench modes``' generator (``replay.trace``)."""
    from loraplex.bench.modes.replay import trace

    rng = random.Random(seed)
    times = gamma_arrivals(rng, rate, 1.0, num_requests / rate)
    drawn = trace(
        rng, len(times), TRACE_SHARES[name], prompt_tokens, 4, output_tokens=OUTPUT_TOKENS
    )
    return tuple(
        TraceRequest(round(t, 6), TENANT, f"rev{r.slot or 0:02d}", len(r.prompt), r.max_tokens)
        for t, r in zip(times, drawn, strict=True)
    )


def hot_token_share(requests: Sequence[TraceRequest]) -> float | None:
    """``rev00``'s share of the trace's tokens (prompt + generated)."""
    total = sum(r.prompt_tokens + r.output_tokens for r in requests)
    hot = sum(r.prompt_tokens + r.output_tokens for r in requests if r.adapter == "rev00")
    return ratio(hot, total, 4)
