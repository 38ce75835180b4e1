"""``loraplex bench modes``: merged vs unmerged vs base execution, side by side in one run.

Decode-shaped steps (one new token per sequence over a prefilled context) on a random model of a
demo preset's shapes with 16 random adapters (ranks 8-64, every target module), timed with
interleaved, warmed-up medians (WORKLOADS.md rules) on one clock. Scenarios:

- ``single``: every sequence on one revision: base (no LoRA), unmerged, merged, in
  ``single_rounds`` rounds of samples at least ``sample_ms`` long, each sample the median of
  ``single_blocks`` interleaved ABBA blocks (:func:`single_figures`):
  tokens/s from the per-variant medians, and ``single_paired``: the ratios paired round by round
  (median, min, max).
- ``skewed``: per step 80 % of the sequences on the hot revision, the rest over 15 others:
  unmerged vs ``auto`` (whatever :func:`~loraplex.engine.mode_policy.decide` picks from the
  measured costs, the LoRA cost being the one the skewed replay's ``auto`` measured online,
  and the trace's token share).
- ``uniform``: 16 revisions evenly: unmerged vs ``auto``.
- flapping: a trace alternating its hot revision every 30 s replayed through ``decide`` in
  simulated time with the measured costs.
- probes: greedy continuations of every adapter unmerged, merged, and with another revision
  merged (the negative-slot path), judged by the parity rule (bench/modes/parity.py): float32
  exact, 16-bit dtypes a near-tie only; any other difference fails the bench. Every accepted
  divergence is reported (``parity``).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from loraplex.bench.execution.timing import interleaved_medians, paired_rounds
from loraplex.bench.modes.parity import ParityReport, ParityRule, ProbeMismatchError
from loraplex.bench.modes.replay import compare_modes, hot_token_share, trace
from loraplex.bench.modes.setup import (
    HOT,
    NUM_ADAPTERS,
    BackendView,
    ModesBenchConfig,
    Setup,
    decode_step,
    prefill_step,
    probes,
)
from loraplex.engine.mode_policy import (
    Action,
    MeasuredCosts,
    ModePolicyConfig,
    TokenWindow,
    decide,
)
from loraplex.model.llama import LoraApplier

__all__ = ["ModesBenchConfig", "ProbeMismatchError", "run_modes_bench"]


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


def gain_bound(hot_share: float, overhead: float | None) -> float | None:
    """The most ``auto`` / unmerged can reach with ``hot_share`` of the tokens on the merged
    revision when the unmerged LoRA op costs ``overhead`` (base / unmerged, on that same mixed
    batch: a mixed batch's LoRA op costs more than one revision's) and LoRA work is per token:
    merged, the hot tokens' LoRA work goes and every other token pays one more pass, so the
    step loses ``(2 share - 1)`` of its LoRA fraction ``1 - 1 / overhead``.
    Launch-bound steps (a pass per adapter whatever its tokens) get less (docs/modes.md)."""
    if overhead is None or overhead <= 0:
        return None
    saved = (2 * hot_share - 1) * (1 - 1 / overhead)
    return None if saved >= 1 else 1 / (1 - saved)


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


def transition_ms(setup: Setup) -> tuple[list[float], list[float]]:
    merges, unmerges = [], []
    for _ in range(setup.config.num_transitions):
        start = time.perf_counter()
        setup.merge(HOT)
        merges.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        setup.unmerge()
        unmerges.append((time.perf_counter() - start) * 1000)
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


def auto_costs(costs: MeasuredCosts, replay: object) -> MeasuredCosts:
    """``costs`` with the LoRA cost the skewed replay's ``auto`` measured online (the median
    over its replays), as an engine's ``auto`` weighs it; none measured: the prior, marked
    unmeasured, so nothing merges on it (the base / unmerged pair it comes from is inside one
    round's noise where LoRA is a small part of a step: it read 0 on the large preset)."""
    measured = replay.get("auto_lora_s_per_token") if isinstance(replay, dict) else None
    if not isinstance(measured, float):
        return replace(costs, lora_measured=False)
    return replace(costs, lora_s_per_token=measured, lora_measured=True)


def auto_decision(slots: list[int | None], costs: MeasuredCosts) -> int | None:
    """The slot ``auto`` merges for a steady trace of ``slots`` steps at 50 steps/s."""
    window = TokenWindow(ModePolicyConfig().window_s, 0.0)
    for t in range(60):
        for slot in slots:
            window.record(float(t), None if slot is None else str(slot), 50)
    got = decide(None, None, window.share(59.0), costs, ModePolicyConfig())
    return None if got.action is Action.STAY or got.revision is None else int(got.revision)


def flaps_per_min(
    costs: MeasuredCosts,
    minutes: int,
    rng: random.Random,
    config: ModePolicyConfig | None = None,
) -> float:
    """Transitions per minute on a trace alternating its hot revision every 30 s (1 step/s,
    200 tokens a step, 80 % on the hot one), replayed through ``decide`` in simulated time."""
    config = config or ModePolicyConfig()
    window = TokenWindow(config.window_s, 0.0)
    merged: str | None = None
    last: float | None = None
    count = 0
    for now in range(60 * minutes):
        hot = "a" if (now // 30) % 2 == 0 else "b"
        for _ in range(200):
            window.record(float(now), hot if rng.random() < 0.8 else f"c{rng.randrange(15)}", 1)
        got = decide(
            merged, None if last is None else now - last, window.share(float(now)), costs, config
        )
        if got.action is not Action.STAY:
            merged, last, count = got.revision, float(now), count + 1
    return count / minutes


def strategies(setup: Setup, slots: list[int | None]) -> dict[str, object]:
    """Unmerged decode tokens/s of ``slots`` with each torch strategy forced and with ``auto``
    (interleaved, one clock), and the strategy ``auto`` chose: does it pick the faster one?"""
    views = {name: BackendView(setup.pool, name) for name in ("masked", "grouped", "auto")}
    tps = throughput(setup, {name: (slots, view) for name, view in views.items()})
    best = max(tps["masked"], tps["grouped"])
    return {
        "tokens_per_s": tps,
        "auto_chose": views["auto"].last_strategy,
        "auto_over_best_forced": ratio(tps["auto"], best),
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


def replay_figures(
    setup: Setup, costs: MeasuredCosts, rng: random.Random, report: ParityReport
) -> dict[str, object]:
    """Request-level replays (bench/modes/replay.py), unmerged vs ``auto``: the 80 % trace and
    the uniform one, ``batch_size`` closed-loop clients, ``context_tokens``-token prompts."""
    cfg = setup.config
    vocab = setup.model.config.vocab_size
    out: dict[str, object] = {}
    for name, share in (("skewed80", 0.8), ("uniform16", None)):
        requests = trace(rng, cfg.replay_requests, share, cfg.context_tokens, vocab)
        figures = compare_modes(
            setup, requests, cfg.batch_size, costs, cfg.replay_rounds, report=report
        )
        out[f"{name}_replay"] = {"hot_token_share": hot_token_share(requests), **figures}
    return out


def run_modes_bench(config: ModesBenchConfig) -> dict[str, object]:
    """The JSON-line object: name, config, seed, metrics."""
    rng = random.Random(config.seed)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        parity = ParityReport(ParityRule.for_dtype(config.dtype))
        probes(setup, parity)
        num_probes = parity.compared - len(parity.accepted)
        merges, unmerges = transition_ms(setup)
        merged = setup.merge(HOT)
        try:
            single_tps, single_paired = single_figures(setup, merged)
        finally:
            setup.unmerge()
        lora_s = (1 / single_tps["unmerged"] - 1 / single_tps["base"]) if single_tps["base"] else 0
        lora_prior = max(lora_s, 0.0)  # the replays' prior; their auto measures its own
        costs = MeasuredCosts(  # the unmerged steps just timed are the veto's baseline
            statistics.median(merges + unmerges) / 1000,
            lora_prior,
            unmerged_step_s_per_token=1 / single_tps["unmerged"],
        )
        skewed = skewed_slots(rng, config.batch_size, 0.8)
        uniform: list[int | None] = [i % NUM_ADAPTERS for i in range(config.batch_size)]
        metrics: dict[str, object] = {
            "skewed80_unmerged_strategies": strategies(setup, skewed),
            "share_sweep": share_sweep(setup, rng),
            **replay_figures(setup, costs, rng, parity),
        }
        costs = auto_costs(costs, metrics["skewed80_replay"])
        for name, slots in (("skewed80", skewed), ("uniform16", uniform)):
            choice = auto_decision(slots, costs)
            auto = setup.merge(choice) if choice is not None else setup.pool
            try:
                variants: dict[str, tuple[list[int | None], LoraApplier | None]] = {
                    "base": (slots, None),
                    "unmerged": (slots, setup.pool),
                    "auto": (slots, auto),
                }
                if name == "skewed80":
                    variants["free_negative"] = (hot_as_base(slots), setup.pool)
                tps = throughput(setup, variants)
            finally:
                if choice is not None:
                    setup.unmerge()
            metrics[f"{name}_auto_merged_slot"] = choice
            metrics[f"{name}_auto_over_unmerged"] = ratio(tps["auto"], tps["unmerged"])
            # the LoRA overhead of this very batch (base / unmerged, same group and clock)
            metrics[f"{name}_lora_overhead"] = ratio(tps["base"], tps["unmerged"])
            if "free_negative" in tps:  # merged / unmerged's ceiling on this batch, same group
                metrics[f"{name}_free_negative_over_unmerged"] = ratio(
                    tps["free_negative"], tps["unmerged"]
                )
        metrics.update(prefill_figures(setup, skewed))
    hot = sum(s == HOT for s in skewed) / len(skewed)
    overhead = ratio(single_tps["base"], single_tps["unmerged"])
    skewed_overhead = metrics["skewed80_lora_overhead"]
    if not isinstance(skewed_overhead, float | None):
        raise TypeError("skewed80_lora_overhead is not a ratio")
    metrics.update(
        {
            "single_merged_over_base": ratio(single_tps["merged"], single_tps["base"]),
            "single_merged_over_unmerged": ratio(single_tps["merged"], single_tps["unmerged"]),
            "unmerged_lora_overhead": overhead,
            "skewed80_hot_share": hot,
            "skewed80_gain_bound": gain_bound(hot, skewed_overhead),
            "single_tokens_per_s": single_tps,
            "single_paired": single_paired,
            "mode_transition_ms_p50": pct(merges + unmerges, 0.5),
            "mode_transition_ms_p99": pct(merges + unmerges, 0.99),
            "merge_ms_p50": pct(merges, 0.5),
            "unmerge_ms_p50": pct(unmerges, 0.5),
            "mode_flaps_per_min": flaps_per_min(costs, 10, rng),
            "probes_identical": num_probes,
            "parity": parity.describe(),
            "lora_s_per_token": lora_prior,
            "auto_costs": {  # what the step-level auto and the flap trace weighed
                "lora_s_per_token": costs.lora_s_per_token,
                "lora_measured": costs.lora_measured,
                "transition_s": costs.transition_s,
            },
        }
    )
    return {
        "name": "modes",
        "config": {
            **config.__dict__,
            "threads": torch.get_num_threads(),
            "kv_cache": "contiguous",
            "machine": "shared CPU (busy: read ratios with care)",
        },
        "seed": config.seed,
        "metrics": metrics,
    }
