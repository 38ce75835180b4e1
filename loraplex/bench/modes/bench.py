"""``loraplex bench modes``: merged vs unmerged vs base execution, side by side in one run.

Decode-shaped steps (one new token per sequence over a prefilled context) on a random model of a
demo preset's shapes with 16 random adapters (ranks 8-64, every target module), timed with
interleaved, warmed-up medians (WORKLOADS.md rules) on one clock. Scenarios:

- ``single``: every sequence on one revision: base (no LoRA), unmerged, merged, in
  ``single_rounds`` rounds of samples at least ``sample_ms`` long, each sample the median of
  ``single_blocks`` interleaved ABBA blocks (``figures.single_figures``):
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

This module runs the scenarios and assembles the result; the timed figures are in
``bench/modes/figures.py``, what ``auto`` decides (worked out, not timed) in
``bench/modes/decisions.py``.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from pathlib import Path

import torch

from loraplex.bench.modes.decisions import auto_costs, auto_decision, flaps_per_min, gain_bound
from loraplex.bench.modes.figures import (
    hot_as_base,
    pct,
    prefill_figures,
    ratio,
    share_sweep,
    single_figures,
    skewed_slots,
    strategies,
    throughput,
    transition_ms,
)
from loraplex.bench.modes.parity import ParityReport, ParityRule, ProbeMismatchError
from loraplex.bench.modes.replay import compare_modes, hot_token_share, trace
from loraplex.bench.modes.setup import HOT, NUM_ADAPTERS, ModesBenchConfig, Setup, probes
from loraplex.engine.mode_policy import MeasuredCosts
from loraplex.model.llama import LoraApplier

__all__ = ["ModesBenchConfig", "ProbeMismatchError", "run_modes_bench"]


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
        commits: list[float] = []
        releases: list[float] = []
        merges, unmerges = transition_ms(setup, commits, releases)
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
            # a merge's commit alone (the steps' stall; the rest of merge_ms is its staging,
            # spread over step boundaries by the engine) and an unmerge: what steps wait for
            "merge_commit_ms_p50": pct(commits, 0.5),
            "merge_commit_ms_p99": pct(commits, 0.99),
            "unmerge_ms_p99": pct(unmerges, 0.99),
            # freeing the merged weights' arena after an unmerge: not a stall, the engine
            # frees it ``ARENA_RELEASE_BYTES`` per step boundary (buffers.ArenaReleases)
            "unmerge_release_ms_p50": pct(releases, 0.5),
            "unmerge_release_ms_p99": pct(releases, 0.99),
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
            # what base_linear_kernel resolved to: every side (base, unmerged, merged, auto)
            # runs this one model, and a merge or unmerge repacks what it wrote (model/merge.py)
            "base_linear_kernel_ran": setup.model.linear_kernel,
            "kv_cache": "contiguous",
            "machine": "shared CPU (busy: read ratios with care)",
        },
        "seed": config.seed,
        "metrics": metrics,
    }
