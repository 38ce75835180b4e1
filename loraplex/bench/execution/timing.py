"""Interleaved, warmed-up timing with medians (the measurement rules of WORKLOADS.md)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


def interleaved_medians(
    variants: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    calls_per_round: int,
    warmup_calls: int = 3,
    sync: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each variant.

    Every variant is warmed up first (the first calls of a matmul are many times slower), then
    the variants take turns round by round so drift on a shared machine hits all of them alike;
    odd rounds run them in reverse order (ABBA), so no variant always follows the same one.
    ``sync`` (a device's synchronize) runs before the clock starts and before it stops, so an
    asynchronous device is timed on the work it finished, not on the work it was handed.
    """
    wait = sync if sync is not None else _no_sync
    if rounds < 1 or calls_per_round < 1:
        raise ValueError(
            f"rounds {rounds} / calls_per_round {calls_per_round} are invalid; expected >= 1"
        )
    for fn in variants.values():
        for _ in range(warmup_calls):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            samples[name].append(_per_call(variants[name], calls_per_round, wait))
    return {name: statistics.median(values) for name, values in samples.items()}


def _per_call(fn: Callable[[], object], count: int, wait: Callable[[], object]) -> float:
    """Seconds per call of ``count`` calls of ``fn``, the device synchronized at both ends."""
    wait()
    start = time.perf_counter()
    for _ in range(count):
        fn()
    wait()
    return (time.perf_counter() - start) / count


def _no_sync() -> None:
    """A synchronous device (the CPU) has nothing to wait for."""


@dataclass(frozen=True)
class PairedRounds:
    """Seconds per call of each variant, one sample per ABBA round (:func:`paired_rounds`)."""

    samples: dict[str, list[float]]  # per round: the median of the round's blocks
    calls: dict[str, int]  # calls per block of each variant (sized by duration)
    blocks: dict[str, list[list[float]]]  # per round, every block's seconds per call

    def medians(self) -> dict[str, float]:
        """Median seconds per call of each variant over the rounds."""
        return {name: statistics.median(values) for name, values in self.samples.items()}

    def ratio(self, numerator: str, denominator: str) -> dict[str, float | int]:
        """Throughput ``numerator`` / ``denominator`` per round (the two timed in the same
        round, their blocks interleaved), summarised: median, min, max and the number of
        rounds."""
        ratios = [
            den / num
            for num, den in zip(self.samples[numerator], self.samples[denominator], strict=True)
        ]
        return {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "rounds": len(ratios),
        }


def paired_rounds(
    variants: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    min_sample_s: float,
    blocks: int = 1,
    settle_calls: int = 0,
    warmup_calls: int = 3,
    sync: Callable[[], object] | None = None,
) -> PairedRounds:
    """Per-round samples of each variant, for ratios paired round by round.

    Beside :func:`interleaved_medians` (whose results other benches read unchanged): each
    variant's sample is sized by duration, not by a fixed call count, and made of ``blocks``
    blocks: a block's calls are ``ceil(min_sample_s / blocks / t)`` with ``t`` the median of
    ``warmup_calls`` timed calls made once every variant has had ``warmup_calls`` untimed
    ones, so a fast step is timed over as many calls as a slow one's block lasts. In a round
    the variants take turns block by block, the order reversed every other block (ABBA), so
    each variant's blocks are spread over the round alike; a variant's sample in the round is
    the **median** of its blocks' seconds per call, so a load spike that hits one block (a
    few ms of another process) moves no sample, where it moved a whole sample's mean. Every
    variant gets the same estimator; ``blocks=1`` is one block per sample, the rounds
    alternating (the estimator before blocks). A ratio of two variants within a round
    compares samples taken over the same stretch of time. ``settle_calls`` untimed calls
    start every block, so what the variant before left in the caches (another variant's
    weights) is not timed: each block times the variant's steady state, whichever variant
    ran before it and however many calls the block has.
    """
    wait = sync if sync is not None else _no_sync
    if rounds < 1 or not min_sample_s > 0 or warmup_calls < 1 or blocks < 1 or settle_calls < 0:
        raise ValueError(
            f"rounds {rounds} / min_sample_s {min_sample_s} / blocks {blocks} / settle_calls "
            f"{settle_calls} / warmup_calls {warmup_calls} are invalid; expected rounds >= 1, "
            "min_sample_s > 0, blocks >= 1, settle_calls >= 0, warmup_calls >= 1"
        )
    for fn in variants.values():  # every variant warm before any is sized
        for _ in range(warmup_calls):
            fn()
    calls: dict[str, int] = {}
    for name, fn in variants.items():
        times = [_per_call(fn, 1, wait) for _ in range(warmup_calls)]
        per_call = max(statistics.median(times), 1e-9)
        calls[name] = max(1, math.ceil(min_sample_s / blocks / per_call))
    timed: dict[str, list[list[float]]] = {name: [] for name in variants}
    names = list(variants)
    turn = 0  # blocks run so far: the order flips with each
    for _ in range(rounds):
        for name in names:
            timed[name].append([])
        for _ in range(blocks):
            for name in names if turn % 2 == 0 else reversed(names):
                for _ in range(settle_calls):
                    variants[name]()
                timed[name][-1].append(_per_call(variants[name], calls[name], wait))
            turn += 1
    samples = {name: [statistics.median(b) for b in per_round] for name, per_round in timed.items()}
    return PairedRounds(samples, calls, timed)
