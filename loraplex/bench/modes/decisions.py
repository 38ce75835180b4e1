"""What ``auto`` decides and may gain in ``loraplex bench modes``, worked out rather than timed:
the slot :func:`~loraplex.engine.mode_policy.decide` merges for a steady trace, its transitions
per minute on a trace whose hot revision alternates (simulated time), the costs it weighs, and
the most merging can gain on a batch (``gain_bound``).
"""

from __future__ import annotations

import random
from dataclasses import replace

from loraplex.engine.mode_policy import (
    Action,
    MeasuredCosts,
    ModePolicyConfig,
    TokenWindow,
    decide,
)


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
