"""Failure-aware statistics and the undefined-ratio rule (WORKLOADS.md): a failed request
counts at the client's timeout, so a run that fails more never looks faster, and a ratio with an
unknown side or a denominator that is not > 0 is None (JSON null), never 0."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def ratio(
    numerator: float | None, denominator: float | None, digits: int | None = 3
) -> float | None:
    """``numerator / denominator`` rounded to ``digits`` (None: unrounded); None when either
    side is unknown or the denominator is not > 0."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    value = numerator / denominator
    return value if digits is None else round(value, digits)


def at_timeout(ok: bool, seconds: float | None, timeout_s: float) -> float:
    """A completed request's latency; a failed, shed or timed-out one counts as at least the
    timeout."""
    if ok and seconds is not None:
        return seconds
    return max(timeout_s, seconds or 0.0)


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in (0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))
    return ordered[int(rank) - 1]


def median_min_max(values: Sequence[float | None], digits: int = 4) -> list[float] | None:
    """[median, min, max] of repeated measurements of one figure; None when there are none or
    any is undefined (a repeat without data must not vanish into the spread of the others)."""
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        return None
    return [
        round(statistics.median(known), digits),
        round(min(known), digits),
        round(max(known), digits),
    ]
