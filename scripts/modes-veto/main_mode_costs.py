"""Seconds per token of whole steps in each mode, the figures ``auto``'s merged-slower veto
reads (:func:`~loraplex.engine.mode_policy.decide`, ``MeasuredCosts``). Torch-free, so the
replay of ``bench modes`` measures the same way as the engine."""

from __future__ import annotations

from loraplex.engine.mode_policy import SLOWER_MARGIN


class StepCosts:
    """Seconds per token of whole steps, merged and unmerged, as exponential moving averages
    (a step's cost depends on its batch; per token is the comparable unit), overall and per step
    size (a power-of-two bucket of its tokens).

    NOTE: a step's fixed cost is shared by its tokens, so a large step costs less per token than
    a small one in either mode. Overall averages over whatever mix each mode ran said "merged is
    slower" after a stretch of long prompts unmerged and decodes merged, with merging changing
    nothing; so the merged figure that vetoes merging (``merged_like_unmerged``) compares sizes
    measured in both modes only, and ``expire`` forgets a verdict after ``veto_s``."""

    def __init__(self, weight: float = 0.1, min_steps: int = 8) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight {weight} is invalid; expected 0 < weight <= 1")
        if min_steps < 1:
            raise ValueError(f"min_steps {min_steps} is invalid; expected >= 1")
        self.weight, self.min_steps = weight, min_steps
        self._mean: dict[bool, float] = {}
        self._count: dict[bool, int] = {True: 0, False: 0}
        self._sized: dict[tuple[bool, int], tuple[float, int]] = {}  # (mode, size) -> mean, n
        self._slower_since_s: float | None = None  # when the merged figure first read slower

    def record(self, merged: bool, seconds: float, num_tokens: int) -> None:
        if num_tokens < 1 or seconds < 0:
            return  # an idle or clock-less step says nothing about cost
        value = seconds / num_tokens
        self._mean[merged] = self._averaged(self._mean.get(merged), value)
        self._count[merged] += 1
        size = (merged, num_tokens.bit_length())
        mean, count = self._sized.get(size, (None, 0))
        self._sized[size] = (self._averaged(mean, value), count + 1)

    def _averaged(self, old: float | None, value: float) -> float:
        return value if old is None else old + self.weight * (value - old)

    def per_token(self, merged: bool) -> float | None:
        """The average once ``min_steps`` steps were seen in that mode; None before."""
        return self._mean[merged] if self._count[merged] >= self.min_steps else None

    def merged_like_unmerged(self) -> float | None:
        """The merged seconds per token as they would read on the unmerged steps' mix: the
        unmerged average times merged / unmerged over the step sizes with ``min_steps`` steps
        in both modes (weighted by merged steps); None while no size has."""
        unmerged = self.per_token(False)
        pairs = []
        for (merged, size), (mean, count) in self._sized.items():
            other = self._sized.get((False, size))
            if merged and count >= self.min_steps and other and other[1] >= self.min_steps:
                pairs.append((mean / other[0] if other[0] > 0 else 1.0, count))
        if unmerged is None or not pairs:
            return None
        return unmerged * sum(r * n for r, n in pairs) / sum(n for _, n in pairs)

    def forget_merged(self) -> None:
        """Drops every merged figure: the next merged steps are measured afresh."""
        self._mean.pop(True, None)
        self._count[True] = 0
        self._sized = {size: value for size, value in self._sized.items() if not size[0]}

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
