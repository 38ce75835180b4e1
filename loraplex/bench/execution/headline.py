"""The execution benchmark's two parts: the headline comparison and the qualification matrix."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from loraplex.bench.execution.runners import LoraplexRunner, PeftRunner, StepShape, padded
from loraplex.bench.execution.setup import (
    DTYPES,
    MAX_RANK,
    UNIFORM_MIX,
    Case,
    ExecutionBenchConfig,
    Workspace,
    adapter_bytes,
    seq_slots,
)
from loraplex.bench.execution.timing import interleaved_medians

HEADLINE_ADAPTERS = 16
# Forced backends measured next to "auto" in the headline (the choice, documented with numbers).
FORCED = {"mixed_masked": "masked", "mixed_grouped": "grouped", "mixed_loop": "reference"}


def headline(
    config: ExecutionBenchConfig, space: Workspace, dtype_name: str
) -> tuple[dict[str, float], list[dict[str, object]]]:
    """``config.batch_size`` sequences (16 by default) round-robin over 16 distinct S2 adapters:
    every variant interleaved, decode then prefill 64; beside them (decode) the same batch over
    16 distinct rank-16 adapters, with ``config.backend`` and forced grouped. ``mixed`` and
    ``mixed_r16`` use ``config.backend``."""
    device = torch.device(config.device)
    batch = config.batch_size
    runner = LoraplexRunner(
        space.model_dir, DTYPES[dtype_name], batch, config.context_tokens + 64, device
    )
    dirs = space.adapters["S2"][:HEADLINE_ADAPTERS]
    weights = [runner.weights(d, MAX_RANK) for d in dirs]
    pools = {name: runner.pool(weights, backend, MAX_RANK) for name, backend in FORCED.items()}
    pools["mixed"] = runner.pool(weights, config.backend, MAX_RANK)
    pools["mixed_padded"] = runner.pool([padded(w, MAX_RANK) for w in weights], "masked", MAX_RANK)
    uniform = [runner.weights(d, MAX_RANK) for d in space.adapters[UNIFORM_MIX][:HEADLINE_ADAPTERS]]
    pools["mixed_r16"] = runner.pool(uniform, config.backend, MAX_RANK)
    # What auto ran on these adapters before the batched computation (the choice, measured).
    pools["mixed_r16_grouped"] = runner.pool(uniform, "grouped", MAX_RANK)
    peft = PeftRunner(space.model_dir, dirs, DTYPES[dtype_name], device) if config.peft else None
    distinct = [i % HEADLINE_ADAPTERS for i in range(batch)]
    single = [0] * batch
    metrics: dict[str, float] = {}
    rows: list[dict[str, object]] = []
    for step, tokens in (("decode", 1), ("prefill-64", 64)):
        shape = StepShape(batch, tokens, config.context_tokens)
        variants: dict[str, Callable[[], object]] = {
            "base": runner.step(shape, None, None),
            "single": runner.step(shape, single, pools["mixed"]),
        }
        names = list(pools) if step == "decode" else ["mixed"]
        variants.update({name: runner.step(shape, distinct, pools[name]) for name in names})
        if peft is not None:
            variants["peft_base"] = peft.step(shape, None)
            variants["peft_mixed"] = peft.step(shape, distinct)
        rounds = config.rounds if step == "decode" else max(3, config.rounds // 3)
        seconds = interleaved_medians(
            variants, rounds=rounds, calls_per_round=config.calls_per_round, sync=runner.sync
        )
        found = _ratios(seconds, shape, prefix="" if step == "decode" else "prefill_")
        metrics.update(found)
        rows.extend(_rows("headline", dtype_name, step, seconds, shape=shape))
    floor_bytes = adapter_bytes(weights, distinct)
    metrics["bytes_floor"] = runner.weight_bytes() / (runner.weight_bytes() + floor_bytes)
    uniform_bytes = adapter_bytes(uniform, distinct)
    metrics["bytes_floor_r16"] = runner.weight_bytes() / (runner.weight_bytes() + uniform_bytes)
    return metrics, rows


def _ratios(seconds: dict[str, float], shape: StepShape, prefix: str) -> dict[str, float]:
    """Throughput ratios (tokens/s of a over tokens/s of b = seconds of b over seconds of a)."""
    tokens = shape.batch_size * shape.tokens_per_seq
    out = {f"{prefix}{name}_tokens_per_s": tokens / s for name, s in seconds.items()}
    for name, value in seconds.items():
        if name not in ("base", "peft_base", "peft_mixed"):
            out[f"{prefix}{name}_over_base"] = seconds["base"] / value
    if "peft_mixed" in seconds:
        out[f"{prefix}mixed_over_peft"] = seconds["peft_mixed"] / seconds["mixed"]
        out[f"{prefix}peft_mixed_over_peft_base"] = seconds["peft_base"] / seconds["peft_mixed"]
        out[f"{prefix}base_over_peft_base"] = seconds["peft_base"] / seconds["base"]
    return out


def _rows(
    section: str,
    dtype_name: str,
    step: str,
    seconds: dict[str, float],
    *,
    shape: StepShape,
    extra: dict[str, object] | None = None,
) -> list[dict[str, object]]:
    tokens = shape.batch_size * shape.tokens_per_seq
    return [
        {
            "section": section,
            "dtype": dtype_name,
            "step": step,
            "variant": name,
            "batch_size": shape.batch_size,
            "tokens_per_s": round(tokens / s, 1),
            "over_base": round(seconds["base"] / s, 3),
            **(extra or {}),
        }
        for name, s in seconds.items()
    ]


def matrix_rows(
    config: ExecutionBenchConfig, space: Workspace, cases: list[Case]
) -> list[dict[str, object]]:
    """float32 base / single / mixed for every case, with the bytes-moved floor."""
    num_adapters = len(space.adapters["S2"])
    max_batch = max(c.shape(config.context_tokens).batch_size for c in cases)
    runner = LoraplexRunner(
        space.model_dir,
        DTYPES["float32"],
        max(max_batch, num_adapters),
        config.context_tokens + 512,
        torch.device(config.device),
    )
    weights = {
        mix: [runner.weights(d, MAX_RANK) for d in dirs] for mix, dirs in space.adapters.items()
    }
    pools = {mix: runner.pool(w, "auto", MAX_RANK) for mix, w in weights.items()}
    base_bytes = runner.weight_bytes()
    rows: list[dict[str, object]] = []
    for index, case in enumerate(cases):
        shape = case.shape(config.context_tokens)
        slots = seq_slots(case, shape.batch_size, random.Random(config.seed * 7919 + index))
        variants = {
            "base": runner.step(shape, None, None),
            "single": runner.step(shape, [slots[0]] * shape.batch_size, pools[case.mix]),
            "mixed": runner.step(shape, slots, pools[case.mix]),
        }
        heavy = shape.batch_size * shape.tokens_per_seq >= 2048
        rounds = max(2, config.rounds // 4) if heavy else config.rounds
        seconds = interleaved_medians(
            variants,
            rounds=rounds,
            calls_per_round=1 if heavy else config.calls_per_round,
            warmup_calls=1 if heavy else 3,
            sync=runner.sync,
        )
        used = adapter_bytes(weights[case.mix], slots)
        extra: dict[str, object] = {
            "active": case.active,
            "mix": case.mix,
            "popularity": case.popularity,
            "distinct_in_batch": len(set(slots)),
            "bytes_floor": round(base_bytes / (base_bytes + used), 3),
        }
        rows.extend(_rows("matrix", "float32", case.tokens, seconds, shape=shape, extra=extra))
    return rows
