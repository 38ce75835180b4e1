"""Interleaved, warmed-up timing with medians (the measurement rules of WORKLOADS.md)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


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
            fn = variants[name]
            wait()
            start = time.perf_counter()
            for _ in range(calls_per_round):
                fn()
            wait()
            samples[name].append((time.perf_counter() - start) / calls_per_round)
    return {name: statistics.median(values) for name, values in samples.items()}


def _no_sync() -> None:
    """A synchronous device (the CPU) has nothing to wait for."""
