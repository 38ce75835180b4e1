"""``loraplex bench baselines``: both comparators measured on the demo set, one cell per token
shape, as one JSON line (what docs/qualification.md quotes): a dedicated merged server's
capacity, memory and cold start, and the base model's with in-context examples."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from loraplex.qualify.baselines.demo_set import load_assets
from loraplex.qualify.baselines.in_context import DEFAULT_EXAMPLES, measure_in_context
from loraplex.qualify.baselines.separate import measure_separate
from loraplex.qualify.baselines.types import BaselineContext, CellTraffic, MethodResult, Probe
from loraplex.qualify.cost import TOKEN_SHAPES

# What each side's summary keeps of its terms (the full terms stay in the cells' results).
_SEPARATE_KEYS = (
    "capacity_rps",
    "operating_concurrency",
    "sweep_saturated",
    "replica_peak_rss_bytes",
    "cold_start_s",
    "cold_start_samples_s",
    "quality_probes_judged",
    "levels",
    "sweep_load_average_1m",
)
_IN_CONTEXT_KEYS = (
    "capacity_rps",
    "operating_concurrency",
    "sweep_saturated",
    "replica_peak_rss_bytes",
    "extra_prompt_tokens_per_request",
    "swept_prompt_tokens",
    "examples_shown_mean",
    "quality_probes_judged",
    "levels",
    "sweep_load_average_1m",
    "not_served",  # prompts and examples past the model's context: no sweep, no latency
)


@dataclass(frozen=True)
class BaselinesBench:
    """One ``bench baselines`` invocation."""

    shapes: tuple[str, ...]  # TOKEN_SHAPES names, one cell each
    adapters: int  # the first N demo adapters make the cells' traffic and probes
    demand_rps: float  # per adapter
    wall_s: float  # each cell's traffic duration
    ttft_slo_s: float  # objectives the operating point is chosen for
    tpot_slo_s: float

    def __post_init__(self) -> None:
        unknown = [s for s in self.shapes if s not in TOKEN_SHAPES]
        if not self.shapes or unknown:
            raise ValueError(
                f"shapes {list(self.shapes)} is invalid; expected names of {list(TOKEN_SHAPES)}"
            )
        if self.adapters < 1:
            raise ValueError(f"adapters must be >= 1, got {self.adapters}")
        for name in ("demand_rps", "wall_s", "ttft_slo_s", "tpot_slo_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def _cells(ctx: BaselineContext, bench: BaselinesBench) -> list[CellTraffic]:
    adapters = load_assets(ctx).adapters[: bench.adapters]
    probes = [Probe(a.ref, a.probe_prompt, a.expected_continuation) for a in adapters]
    demand = {a.ref: bench.demand_rps for a in adapters}
    requests = max(1, round(bench.demand_rps * len(adapters) * bench.wall_s))
    return [
        CellTraffic(
            f"bench-{name}",
            TOKEN_SHAPES[name],
            requests,
            bench.wall_s,
            demand,
            bench.ttft_slo_s,
            bench.tpot_slo_s,
            probes,
        )
        for name in bench.shapes
    ]


def _summary(result: MethodResult, keys: Sequence[str]) -> dict[str, object]:
    return {
        "pass_ratios": result.pass_ratios,
        "machines": result.machines,
        "cost_per_correct_request": result.cost_per_correct_request,
        **{key: result.terms.get(key) for key in keys},
    }


def run_baselines_bench(ctx: BaselineContext, bench: BaselinesBench) -> dict[str, object]:
    """Both comparators on one cell per shape; the JSON line's payload."""
    load_before = os.getloadavg()
    shapes: dict[str, object] = {}
    for cell in _cells(ctx, bench):
        separate = measure_separate(ctx, cell)
        in_context = measure_in_context(ctx, cell)
        shapes[cell.shape.name] = {
            "prompt_tokens": cell.shape.prompt_tokens,
            "output_tokens": cell.shape.output_tokens,
            "separate": _summary(separate, _SEPARATE_KEYS),
            "in_context": _summary(in_context, _IN_CONTEXT_KEYS),
        }
    return {
        "name": "qualify-baselines",
        "config": {
            "preset": ctx.preset,
            "quick": ctx.quick,
            "shapes": list(bench.shapes),
            "adapters": bench.adapters,
            "demand_rps_per_adapter": bench.demand_rps,
            "wall_s": bench.wall_s,
            "ttft_slo_s": bench.ttft_slo_s,
            "tpot_slo_s": bench.tpot_slo_s,
            "in_context_examples": DEFAULT_EXAMPLES,
            "price": ctx.price.name,
        },
        "load_average_1m": {"start": load_before[0], "end": os.getloadavg()[0]},
        "shapes": shapes,
    }
