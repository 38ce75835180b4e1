"""Seconds per token of whole steps in each mode, the figures ``auto``'s merged-slower veto
reads (:func:`~loraplex.engine.mode_policy.decide`, ``MeasuredCosts``). Torch-free, so the
replay of ``bench modes`` measures the same way as the engine."""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections import deque

from loraplex.engine.mode_policy import SLOWER_MARGIN

# per mode and step size, the per-token costs of this many latest steps are kept (their median
# is the size's figure); and at most this many sizes per mode (the least recently run forgotten)
KEEP_STEPS = 32
MAX_SIZES = 256
# a size's merged / unmerged ratio counts only where its steps differ consistently: a merged step
# slower (or faster) than an unmerged one of the same size in at least this share of all pairs
CONSISTENT = 0.8


class StepCosts:
    """Seconds per token of whole steps, merged and unmerged: overall an exponential moving
    average (a step's cost depends on its batch; per token is the comparable unit), and per step
    size (its exact number of tokens) the median of its latest ``keep`` steps.

    NOTE: a step's fixed cost is shared by its tokens, so a large step costs less per token than
    a small one in either mode. Overall averages over whatever mix each mode ran said "merged is
    slower" after a stretch of long prompts unmerged and decodes merged, with merging changing
    nothing; so the merged figure that vetoes merging (``merged_like_unmerged``) compares sizes
    measured in both modes only, and ``expire`` forgets a verdict after ``veto_s``.

    NOTE (docs/modes.md, "The veto's evidence"): the veto compares the unmerged steps before a
    merge with the merged steps after it, two stretches of time. Sizes were power-of-two
    buckets (a batch draining from 20 sequences to 16 read up to 1.25x per token among the
    20s), each size's figure an average seeded by its first step (weighing 0.48 after eight),
    and on a shared machine the load drifts between the stretches: in 4 of 6 unmerged
    large-preset replays, split where ``auto`` merges, that old figure read "merged is slower"
    with nothing merged. So sizes are exact, each size's figure is the median of its latest
    ``keep`` steps, and a size counts only where its steps differ consistently (``_ratio``)."""

    def __init__(
        self,
        weight: float = 0.1,
        min_steps: int = 8,
        keep: int = KEEP_STEPS,
        max_sizes: int = MAX_SIZES,
    ) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight {weight} is invalid; expected 0 < weight <= 1")
        if min_steps < 1:
            raise ValueError(f"min_steps {min_steps} is invalid; expected >= 1")
        if keep < min_steps:
            raise ValueError(f"keep {keep} is invalid; expected >= min_steps {min_steps}")
        if max_sizes < 1:
            raise ValueError(f"max_sizes {max_sizes} is invalid; expected >= 1")
        self.weight, self.min_steps, self.keep, self.max_sizes = weight, min_steps, keep, max_sizes
        self._mean: dict[bool, float] = {}
        self._count: dict[bool, int] = {True: 0, False: 0}
        # mode -> step size -> (its latest per-token costs, steps seen); insertion order is the
        # order last run (a size run again moves to the end), so the first is forgotten first
        self._sized: dict[bool, dict[int, tuple[deque[float], int]]] = {True: {}, False: {}}
        # size -> its ``_ratio``, made again only once a step of that size ran (in either mode).
        # NOTE: ``_ratio`` sorts and bisects a size's steps, and the engine reads the figure twice
        # a step in ``auto``: over 32 sizes that was 0.28 ms a step, over 256 sizes 2.5 ms
        # (per call, measured); a step changes one size, so one ratio is made again at most
        self._ratios: dict[int, float] = {}
        self._slower_since_s: float | None = None  # when the merged figure first read slower

    def record(self, merged: bool, seconds: float, num_tokens: int) -> None:
        if num_tokens < 1 or seconds < 0:
            return  # an idle or clock-less step says nothing about cost
        value = seconds / num_tokens
        old = self._mean.get(merged)
        self._mean[merged] = value if old is None else old + self.weight * (value - old)
        self._count[merged] += 1
        sizes = self._sized[merged]
        values, count = sizes.pop(num_tokens, (deque(maxlen=self.keep), 0))
        values.append(value)
        sizes[num_tokens] = (values, count + 1)
        self._ratios.pop(num_tokens, None)
        if len(sizes) > self.max_sizes:
            forgotten = next(iter(sizes))
            del sizes[forgotten]
            self._ratios.pop(forgotten, None)

    def per_token(self, merged: bool) -> float | None:
        """The average once ``min_steps`` steps were seen in that mode; None before."""
        return self._mean[merged] if self._count[merged] >= self.min_steps else None

    def merged_like_unmerged(self) -> float | None:
        """The merged seconds per token as they would read on the unmerged steps' mix: the
        unmerged average times merged / unmerged over the step sizes with ``min_steps`` steps
        in both modes (each size's median; weighted by merged steps); None while no size has."""
        unmerged = self.per_token(False)
        pairs = []
        for size, (values, count) in self._sized[True].items():
            other = self._sized[False].get(size)
            if count >= self.min_steps and other is not None and other[1] >= self.min_steps:
                ratio = self._ratios.get(size)
                if ratio is None:
                    ratio = self._ratios[size] = _ratio(values, other[0])
                pairs.append((ratio, count))
        if unmerged is None or not pairs:
            return None
        return unmerged * sum(r * n for r, n in pairs) / sum(n for _, n in pairs)

    def forget_merged(self) -> None:
        """Drops every merged figure: the next merged steps are measured afresh."""
        self._mean.pop(True, None)
        self._count[True] = 0
        self._sized[True] = {}
        self._ratios.clear()

    def expire(self, now_s: float, veto_s: float) -> None:
        """Forgets the merged figures ``veto_s`` after they first read slower than unmerged."""
        merged, unmerged = self.merged_like_unmerged(), self.per_token(False)
        if merged is None or unmerged is None or merged <= unmerged * SLOWER_MARGIN:
            self._slower_since_s = None
        elif self._slower_since_s is None:
            self._slower_since_s = now_s
        elif now_s - self._slower_since_s >= veto_s:
            self.forget_merged()
            self._slower_since_s = None


def _ratio(merged: deque[float], unmerged: deque[float]) -> float:
    """Median merged / median unmerged, where the two differ consistently: a merged step slower
    than an unmerged one in at least ``CONSISTENT`` of all pairs (or faster in as many); 1.0 (no
    difference shown) otherwise, however far apart the medians (a machine whose load drifts
    between the two stretches moves one median, not every pair)."""
    base = statistics.median(unmerged)
    if not base > 0:
        return 1.0
    ordered = sorted(unmerged)
    # pairs where the merged step is slower, a tie counting half
    slower = sum(bisect_left(ordered, v) + bisect_right(ordered, v) for v in merged) / 2
    share = slower / (len(merged) * len(ordered))
    if (1 - CONSISTENT) < share < CONSISTENT:
        return 1.0
    return statistics.median(merged) / base
