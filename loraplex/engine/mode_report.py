"""What an engine says about its execution mode (torch-free): the revision merged into its base
weights (and the one being staged), the measured merge / unmerge stalls and the merges' staging
times, as cumulative histograms.

The report rides in the engine's published queue view (``sched.stats.QueueView.mode``), so it
crosses the engine-process pipe with no message of its own, reaches ``EngineLoad.mode`` and from
there ``/metrics`` (``loraplex_mode_transition_seconds``), the admin guard that refuses to
deprecate or move an alias off a merged revision, and a fleet replica's routing report.
Cumulative counts, not events: a lost or coalesced publish loses nothing, and a restarted engine
starts again from zero, as a Prometheus counter may.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

# Upper bounds (seconds) of the transition histogram's buckets: milliseconds on the small
# preset, seconds on a large model on a contended CPU (docs/modes.md).
TRANSITION_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass(frozen=True)
class TransitionHistogram:
    """Transitions of one direction: counts per bucket of ``TRANSITION_BUCKETS_S`` (not
    cumulative; the last count is above the last bound) and the sum of their seconds."""

    counts: tuple[int, ...] = (0,) * (len(TRANSITION_BUCKETS_S) + 1)  # per bucket, then +Inf
    sum_s: float = 0.0  # total seconds observed

    @property
    def num_observed(self) -> int:
        return sum(self.counts)

    def observe(self, seconds: float) -> TransitionHistogram:
        """This histogram with one more transition of ``seconds``."""
        index = bisect.bisect_left(TRANSITION_BUCKETS_S, seconds)
        counts = list(self.counts)
        counts[index] += 1
        return TransitionHistogram(tuple(counts), self.sum_s + seconds)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (upper bound, count at or below it), ending with ``+Inf``."""
        bounds = [*(repr(b) for b in TRANSITION_BUCKETS_S), "+Inf"]
        total, out = 0, []
        for bound, count in zip(bounds, self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


@dataclass(frozen=True)
class ModeReport:
    """One engine's execution mode now (None in a view: the engine runs ``unmerged``)."""

    setting: str  # the ``mode`` setting ("auto", "merged:<ref>")
    merged_revision: str | None  # ``tenant/name@revision`` in the base weights; None: unmerged
    merge: TransitionHistogram = TransitionHistogram()  # merges so far
    unmerge: TransitionHistogram = TransitionHistogram()  # unmerges so far
    # ``auto``: the unmerged LoRA op's measured seconds per token (None: not measured yet)
    lora_s_per_token: float | None = None
    # the revision whose merged weights are being built beside the live ones (still served
    # unmerged); None: no staging under way
    staging_revision: str | None = None
    # merges' staging work (seconds, over the step boundaries each took) before their commit
    staging: TransitionHistogram = TransitionHistogram()

    def observed(
        self, direction: str, seconds: float, merged: str | None, staging_s: float = 0.0
    ) -> ModeReport:
        """This report after a ``direction`` ("merge" / "unmerge") that stalled the steps for
        ``seconds`` (a merge: after ``staging_s`` of staging)."""
        if direction == "merge":
            return replace(
                self,
                merged_revision=merged,
                staging_revision=None,
                merge=self.merge.observe(seconds),
                staging=self.staging.observe(staging_s),
            )
        if direction == "unmerge":
            return replace(self, merged_revision=merged, unmerge=self.unmerge.observe(seconds))
        raise ValueError(f"direction {direction!r} is invalid; expected 'merge' or 'unmerge'")
