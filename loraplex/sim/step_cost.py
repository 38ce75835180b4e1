"""What one simulated engine step costs: the cost model's step price read off a step plan.

``step_seconds`` counts a plan's decode and prompt tokens, its distinct revisions and their rank
and byte mix, and prices them with ``StepCost`` (``sim/cost_model.py`` states the formula). The
adapters' shapes are one table per run (``adapter_shapes``), shared by every replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.request import Request
from loraplex.engine.step import StepPlan
from loraplex.residency.pipeline import Footprint
from loraplex.sim.cost_model import StepCost


class AdapterShape(NamedTuple):
    """What the step cost reads of one adapter."""

    rank: int  # for the rank mix
    memory_bytes: int  # its weights' bytes (``byte_tokens``)
    width: float  # its bytes per rank (``revision_widths``)


def adapter_shapes(
    footprints: Mapping[AdapterKey, Footprint], ranks: Mapping[AdapterKey, int]
) -> dict[AdapterKey, AdapterShape]:
    """Every adapter's shape, made once per run and shared by its replicas (one table per
    replica was 64 copies of it in a scale run)."""
    return {
        k: AdapterShape(ranks[k], f.memory_bytes, f.memory_bytes / ranks[k])
        for k, f in footprints.items()
    }


def step_seconds(
    plan: StepPlan,
    requests: Mapping[str, Request],
    shapes: Mapping[AdapterKey, AdapterShape],
    cost: StepCost,
    merged: AdapterKey | None = None,
) -> float:
    """The cost model's step time of ``plan`` (``requests``: the scheduler's, by id). A decode
    chunk is one token past the prompt (the last sampled token); every other chunk (a prompt
    chunk, a recompute after preemption) is prefill.

    ``merged``: the revision merged into the replica's base weights (a fleet's dedication,
    ``sim/fleet.py``): its tokens are priced as base-model tokens (no LoRA terms), and every
    other token pays one extra LoRA pass of it (the negative pass that takes it back out:
    ``engine/mode_policy.py``'s cost of a merge), its rank, bytes and width counted once more.
    An assumption, not calibrated: ``sim calibrate`` measures no merged step."""
    keys: set[AdapterKey] = set()
    rank_tokens = decode_tokens = byte_tokens = 0
    unmerged = 0  # tokens not of the ``merged`` revision (each pays its negative pass)
    for chunk in plan.chunks:
        request = requests[chunk.request_id].request
        num = len(chunk.token_ids)
        if num == 1 and chunk.start_pos >= len(request.prompt_token_ids):
            decode_tokens += 1
        key = request.adapter_key
        if merged is not None:
            if key == merged:
                continue
            unmerged += num
        if key is not None:
            keys.add(key)
            rank, nbytes, _ = shapes[key]
            rank_tokens += num * rank
            byte_tokens += num * nbytes
    if merged is not None and unmerged:
        keys.add(merged)
        rank, nbytes, _ = shapes[merged]
        rank_tokens += unmerged * rank
        byte_tokens += unmerged * nbytes
    prefill_tokens = plan.num_tokens - decode_tokens
    if not cost.prices_weights:  # an older file: the old model's inputs, exactly
        return cost.seconds(decode_tokens, prefill_tokens, len(keys), rank_tokens)
    # An exact sum, so any set order gives it (of one width: that width, as fsum gives it).
    if len(keys) == 1:
        widths = shapes[next(iter(keys))].width
    else:
        widths = math.fsum(shapes[k].width for k in keys)
    return cost.seconds(
        decode_tokens,
        prefill_tokens,
        len(keys),
        rank_tokens,
        byte_tokens=byte_tokens,
        revision_widths=widths,
    )
