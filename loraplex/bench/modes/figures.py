"""The timed figures of ``loraplex bench modes``: tokens/s of step variants side by side on one
clock (interleaved, warmed-up medians; ``single_figures``: paired ABBA rounds), merge and unmerge
times, the strategies ``auto`` picks from, and the batches they are timed on.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from loraplex.bench.execution.timing import interleaved_medians, paired_rounds
from loraplex.bench.modes.decisions import gain_bound
from loraplex.bench.modes.setup import (
    HOT,
    NUM_ADAPTERS,
    BackendView,
    GroupedFloat32,
    Setup,
    decode_step,
    prefill_step,
)
from loraplex.model.llama import LoraApplier
from loraplex.ops.plan import half_on_cpu


def throughput(
    setup: Setup,
    variants: dict[str, tuple[list[int | None], LoraApplier | None]],
    *,
    prefill: bool = False,
) -> dict[str, float]:
    """Tokens per second of each variant (same batch, interleaved, one clock): decode steps,
    or with ``prefill`` whole-prompt prefill steps (``context_tokens`` per sequence)."""
    cfg = setup.config
    fns: dict[str, Callable[[], object]] = {}
    make = prefill_step if prefill else decode_step
    for name, (slots, lora) in variants.items():
        step = make(setup, slots)
        fns[name] = lambda step=step, lora=lora: step(lora)  # type: ignore[misc]
    medians = interleaved_medians(fns, rounds=cfg.rounds, calls_per_round=cfg.calls_per_round)
    tokens = cfg.batch_size * (cfg.context_tokens if prefill else 1)
    return {name: tokens / seconds for name, seconds in medians.items()}


def single_figures(setup: Setup, merged: LoraApplier) -> tuple[dict[str, float], dict[str, object]]:
    """One revision's decode step as base (no applier), unmerged (the pool) and merged (the
    merged applier: its ``prepare`` returns a NONE batch, so base and merged differ by that
    call only, on the same merged weights). Timed by :func:`paired_rounds`: each sample lasts
    at least ``sample_ms`` (a fast bfloat16 step gets more calls) in ``single_blocks`` blocks,
    the variants taking turns block by block (ABBA) and a sample being its median block;
    base is timed twice (``base_again``: an A/A control whose paired ratio is the noise
    floor merged / base is read against), and unmerged too (``unmerged_again``), so that the
    order -- unmerged, merged, base, base_again, unmerged_again, reversed every other block --
    puts the control where merged is, mirrored about base: each follows base in one half of
    the blocks and an unmerged sample in the other, so a neighbour's effect on a sample (a
    cache the LoRA arenas evicted) is the same for both; and every block starts with one
    untimed call (``settle_calls``), so no block times what its predecessor left in the
    caches: each times its variant's steady state, as a replica serving one revision runs it.
    Returns tokens/s of base, unmerged and merged (from the per-variant medians, as
    :func:`throughput`) and the per-round paired ratios summarised."""
    cfg = setup.config
    step = decode_step(setup, [HOT] * cfg.batch_size)
    timed = paired_rounds(
        {  # this order: see the docstring
            "unmerged": lambda: step(setup.pool),
            "merged": lambda: step(merged),
            "base": lambda: step(None),
            "base_again": lambda: step(None),  # the A/A control: the noise floor of a ratio
            "unmerged_again": lambda: step(setup.pool),  # merged's mirror image of unmerged
        },
        rounds=cfg.single_rounds,
        min_sample_s=cfg.sample_ms / 1000,
        blocks=cfg.single_blocks,
        settle_calls=1,
    )
    medians = timed.medians()
    tps = {name: cfg.batch_size / medians[name] for name in ("base", "unmerged", "merged")}
    paired: dict[str, object] = {
        "base_again_over_base": timed.ratio("base_again", "base"),
        "unmerged_again_over_unmerged": timed.ratio("unmerged_again", "unmerged"),
        "merged_over_base": timed.ratio("merged", "base"),
        "merged_over_unmerged": timed.ratio("merged", "unmerged"),
        "unmerged_lora_overhead": timed.ratio("base", "unmerged"),
        "calls_per_block": timed.calls,
        "blocks_per_sample": cfg.single_blocks,
    }
    return tps, paired


def hot_as_base(slots: list[int | None]) -> list[int | None]:
    """``slots`` with the hot revision's sequences on the base model: run unmerged, the step
    every merged execution of ``slots`` is at best (the hot tokens' LoRA work gone and the
    negative pass free; the other tokens' own adapters still run), so its tokens/s over
    unmerged's is the ceiling of merged / unmerged on that batch, measured."""
    return [None if s == HOT else s for s in slots]


def prefill_figures(setup: Setup, skewed: list[int | None]) -> dict[str, object]:
    """Prefill steps: the unmerged LoRA overhead on one revision, and the skewed trace merged
    (the hot revision) over unmerged, and its ceiling (:func:`hot_as_base`); same work on
    every side, one clock."""
    single: list[int | None] = [HOT] * setup.config.batch_size
    merged = setup.merge(HOT)
    try:
        one = throughput(
            setup, {"base": (single, None), "unmerged": (single, setup.pool)}, prefill=True
        )
        mixed = throughput(
            setup,
            {
                "base": (skewed, None),
                "unmerged": (skewed, setup.pool),
                "merged": (skewed, merged),
                "free_negative": (hot_as_base(skewed), setup.pool),
            },
            prefill=True,
        )
    finally:
        setup.unmerge()
    overhead = ratio(one["base"], one["unmerged"])
    mixed_overhead = ratio(mixed["base"], mixed["unmerged"])
    hot = sum(s == HOT for s in skewed) / len(skewed)
    return {
        "prefill_unmerged_lora_overhead": overhead,
        "prefill_skewed80_merged_over_unmerged": ratio(mixed["merged"], mixed["unmerged"]),
        "prefill_skewed80_free_negative_over_unmerged": ratio(
            mixed["free_negative"], mixed["unmerged"]
        ),
        "prefill_skewed80_lora_overhead": mixed_overhead,
        "prefill_skewed80_gain_bound": gain_bound(hot, mixed_overhead),
        "prefill_tokens_per_s": {**one, **{f"skewed80_{k}": v for k, v in mixed.items()}},
    }


def transition_ms(
    setup: Setup, commits: list[float] | None = None, releases: list[float] | None = None
) -> tuple[list[float], list[float]]:
    """Each merge's ms (staged whole, then committed) and each unmerge's (what the steps wait
    for); ``commits``, when given, gets each merge's commit alone (what the steps wait for; the
    rest is staging), ``releases`` each unmerge's freeing of the merged weights' arena after it
    (the engine spreads it over the step boundaries that follow, ``ARENA_RELEASE_BYTES`` each)."""
    merges, unmerges = [], []
    for _ in range(setup.config.num_transitions):
        start = time.perf_counter()
        staging = setup.begin_merge(HOT)
        staging.advance(math.inf)
        staged = time.perf_counter()
        setup.commit(staging, HOT)
        merges.append((time.perf_counter() - start) * 1000)
        if commits is not None:
            commits.append((time.perf_counter() - staged) * 1000)
        start = time.perf_counter()
        setup.unmerge(release_now=False)
        unmerges.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        setup.merger.releases.drain()
        if releases is not None:
            releases.append((time.perf_counter() - start) * 1000)
    return merges, unmerges


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ratio(a: float, b: float) -> float | None:
    return None if not b else a / b


def skewed_slots(rng: random.Random, n: int, hot_share: float) -> list[int | None]:
    """``n`` sequences, ``round(hot_share * n)`` of them on the hot revision (exactly the share
    the scenario names, as near as ``n`` allows: a random draw per sequence gave 0.69 for 0.8
    at 16), the rest spread at random over the 15 others, in shuffled order."""
    num_hot = round(hot_share * n)
    slots: list[int | None] = [HOT] * num_hot
    slots += [rng.randrange(1, NUM_ADAPTERS) for _ in range(n - num_hot)]
    rng.shuffle(slots)
    return slots


def forced_views(setup: Setup) -> dict[str, BackendView]:
    """Every computation the unmerged op can run on this setup, each forced: masked, grouped,
    batched, and where the float32 pass can run (16-bit weights on a CPU) grouped through it."""
    views = {name: BackendView(setup.pool, name) for name in ("masked", "grouped", "batched")}
    if half_on_cpu(setup.pool.layout):
        views["grouped_float32"] = BackendView(setup.pool, GroupedFloat32())
    return views


def strategies(setup: Setup, slots: list[int | None]) -> dict[str, object]:
    """Unmerged decode tokens/s of ``slots`` with each strategy forced (:func:`forced_views`)
    and with ``auto`` (interleaved, one clock), the fastest forced one, and what ``auto``
    chose: does it pick the fastest?"""
    forced = forced_views(setup)
    auto = BackendView(setup.pool, "auto")
    views = {**forced, "auto": auto}
    tps = throughput(setup, {name: (slots, view) for name, view in views.items()})
    best = max(forced, key=lambda name: tps[name])
    return {
        "tokens_per_s": tps,
        "auto_chose": auto.last_strategy,
        "auto_ran_as": auto.last_ran_as,
        "best_forced": best,
        "auto_over_best_forced": ratio(tps["auto"], tps[best]),
    }


SWEEP_SHARES = (0.25, 0.5, 0.65, 0.8, 0.95, 1.0)


def share_sweep(setup: Setup, rng: random.Random) -> list[dict[str, object]]:
    """Tokens/s unmerged vs merged (the hot revision) as the hot revision's share grows."""
    rows: list[dict[str, object]] = []
    for share in SWEEP_SHARES:
        slots = skewed_slots(rng, setup.config.batch_size, share)
        merged = setup.merge(HOT)
        try:
            tps = throughput(setup, {"unmerged": (slots, setup.pool), "merged": (slots, merged)})
        finally:
            setup.unmerge()
        actual = sum(s == HOT for s in slots) / len(slots)
        rows.append(
            {
                "hot_share": actual,
                **tps,
                "merged_over_unmerged": ratio(tps["merged"], tps["unmerged"]),
            }
        )
    return rows
