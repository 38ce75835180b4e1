"""``loraplex bench fleet``'s repeats: each figure as the median over the repeats, with its
min and max beside it.

A figure is computed per repeat (one deployment replaying the trace) and then aggregated, not
pooled over the repeats' requests: a P99 pooled over three repeats hides whether one bad repeat
made it, the spread shows it. A headline ratio is taken per repeat, between the two policies'
runs of the same repeat (adjacent in the alternating run order, so machine drift hits both
alike), then aggregated the same way.

Undefined stays undefined: a figure that is None (null) in any repeat has no median and no
spread (None), never a median of the repeats that happened to be defined.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

Spread = list[float]  # [min, max] over the repeats (a JSON pair)


def median_of(values: Sequence[float | None], digits: int = 4) -> float | None:
    """The median of ``values`` rounded to ``digits``; None when there are none or any is None."""
    if not values or any(v is None for v in values):
        return None
    return round(statistics.median(v for v in values if v is not None), digits)


def spread_of(values: Sequence[float | None]) -> Spread | None:
    """``[min, max]`` of ``values``; None when there are none or any is None."""
    if not values or any(v is None for v in values):
        return None
    defined = [v for v in values if v is not None]
    return [min(defined), max(defined)]


def aggregate(figures: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """Each of ``keys`` (a number, or a mapping of numbers such as ``ttft_ms``) as the median over
    ``figures`` (one mapping per repeat), and ``spread``: the same keys as ``[min, max]``."""
    medians: dict[str, Any] = {}
    spreads: dict[str, Any] = {}
    for key in keys:
        values = [f[key] for f in figures]
        if values and all(isinstance(v, Mapping) for v in values):
            parts = list(values[0])
            medians[key] = {p: median_of([v[p] for v in values]) for p in parts}
            spreads[key] = {p: spread_of([v[p] for v in values]) for p in parts}
        else:
            medians[key] = median_of(values)
            spreads[key] = spread_of(values)
    return {**medians, "spread": spreads}
