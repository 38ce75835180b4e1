"""In-context examples: the base model, no adapter, with k examples of the adapter's behaviour
in the prompt instead.

The examples are the cell's other probes (prompt followed by its expected continuation), those
of the same adapter first; never the probe under test, never one with the same prompt (another
revision of the same adapter would teach a different answer to that very prompt), never one
whose text contains the answer under test. Measured on a real server of the base model: each
probe's pass ratio with its examples, the extra prompt tokens the examples cost (the server's
own token counts, with and without them), and a load sweep at the longer prompts. The demo model
is tiny and generated: quality near 0 is a finding, not a fault.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from loraplex.qualify.baselines import measure
from loraplex.qualify.baselines.demo_set import (
    cache_of,
    context_tokens,
    load_assets,
    max_model_len,
    server_dir,
    vocab_size,
)
from loraplex.qualify.baselines.priced import Footprint, price_in_context, quality_ratio
from loraplex.qualify.baselines.server import (
    ServerSpec,
    machine_memory_bytes,
    peak_rss_bytes,
    pooled_server,
)
from loraplex.qualify.baselines.types import (
    CHECKS,
    BaselineContext,
    CellTraffic,
    MethodResult,
    Probe,
)

DEFAULT_EXAMPLES = 4  # k: examples per prompt
_SEPARATOR = " "  # between examples and before the prompt (the demo corpus's sentence gap)


@dataclass(frozen=True)
class InContextPrompt:
    """A probe's prompt with examples before it."""

    text: str  # examples, then the probe's own prompt
    examples: tuple[Probe, ...]  # the probes shown as examples, in order
    same_adapter: int  # how many of them are probes of the probe's own adapter


def build_prompt(probe: Probe, pool: Sequence[Probe], k: int) -> InContextPrompt:
    """Up to ``k`` examples from ``pool`` before ``probe.prompt`` (rules: module docstring)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    seen: set[tuple[str, str]] = set()
    candidates = []
    for other in pool:
        pair = (other.prompt, other.expected)
        shown = other.prompt + other.expected
        if other.prompt == probe.prompt or probe.expected in shown or pair in seen:
            continue
        seen.add(pair)
        candidates.append(other)
    candidates.sort(key=lambda other: other.adapter_ref != probe.adapter_ref)  # stable
    examples = tuple(candidates[:k])
    parts = [other.prompt + other.expected for other in examples] + [probe.prompt]
    same = sum(other.adapter_ref == probe.adapter_ref for other in examples)
    return InContextPrompt(_SEPARATOR.join(parts), examples, same)


def _judgment_key(prompt: InContextPrompt, probe: Probe) -> str:
    return f"in_context/quality/{prompt.text}/{probe.expected}"


def _plain_key(probe: Probe) -> str:
    return f"in_context/plain-tokens/{probe.prompt}"


def _sweep_key(prompt_tokens: int, output_tokens: int) -> str:
    return f"in_context/sweep/{prompt_tokens}/{output_tokens}"


def _swept_prompt_tokens(cell: CellTraffic, extra_tokens: float) -> int:
    """The sweep's prompt length: the cell's, plus the examples' mean extra, rounded up to a
    16-token block (cells whose examples cost about as much share one sweep)."""
    return cell.shape.prompt_tokens + 16 * math.ceil(extra_tokens / 16)


def _extra_tokens(cache: measure.RunCache, prompts: dict[Probe, InContextPrompt]) -> float | None:
    """Mean extra prompt tokens per request, from the server's own counts; None when a count
    is not cached yet."""
    extras = []
    for probe, prompt in prompts.items():
        judged, plain = cache.get(_judgment_key(prompt, probe)), cache.get(_plain_key(probe))
        if not isinstance(judged, dict) or not isinstance(plain, int):
            return None
        extras.append(int(judged["prompt_tokens"]) - plain)
    return sum(extras) / len(extras)


def _measure(
    ctx: BaselineContext, cell: CellTraffic, prompts: dict[Probe, InContextPrompt]
) -> None:
    """Start the base model's server if anything is missing from the cache, and measure it."""
    cache = measure.RunCache(cache_of(ctx))
    extra = _extra_tokens(cache, prompts)
    shape = cell.shape
    assets = load_assets(ctx)
    window = context_tokens(assets.base_model_dir)
    if extra is not None and _swept_is_known(cache, cell, extra, window):
        return
    longest = max(len(p.text) for p in prompts.values())  # a token is at least one character
    spec = ServerSpec(
        assets.base_model_dir,
        server_dir(ctx, "in-context"),
        max_model_len(shape.prompt_tokens + longest, shape.output_tokens, assets.base_model_dir),
    )
    vocab = vocab_size(assets)
    with pooled_server(ctx.servers, spec) as server:
        for probe, prompt in prompts.items():
            passed, tokens = measure.judge(server, prompt.text, probe.expected)
            cache.put(_judgment_key(prompt, probe), {"passed": passed, "prompt_tokens": tokens})
            _, plain = measure.judge(server, probe.prompt, probe.expected)
            cache.put(_plain_key(probe), plain)
        extra = _extra_tokens(cache, prompts)
        if extra is None:
            raise RuntimeError("in-context prompt lengths were measured but not recorded")
        swept = _swept_prompt_tokens(cell, extra)
        if not _swept_is_known(cache, cell, extra, window):
            levels = measure.sweep(server, swept, shape.output_tokens, vocab, ctx.quick)
            record = {
                "levels": [measure.level_to_json(level) for level in levels],
                "peak_rss_bytes": peak_rss_bytes(server.pid),
                "load_average_1m": os.getloadavg()[0],
            }
            cache.put(_sweep_key(swept, shape.output_tokens), record)


def _swept_is_known(cache: measure.RunCache, cell: CellTraffic, extra: float, window: int) -> bool:
    """Whether the sweep at the longer prompts is measured, or needs no measuring: prompts that
    with the output exceed the model's context are all refused (a 400 each)."""
    swept = _swept_prompt_tokens(cell, extra)
    too_long = swept + cell.shape.output_tokens > window
    return too_long or cache.get(_sweep_key(swept, cell.shape.output_tokens)) is not None


def _not_served(
    cell: CellTraffic, judged: dict[Probe, bool | None], terms: dict[str, object], window: int
) -> MethodResult:
    """The in-context deployment of a cell whose prompts and examples exceed the model's
    context: it could answer none of the cell's requests, so its latency and cost are
    undefined. NOTE: its load sweep used to run anyway, every request refused, and was reported
    as latency 0.0 on 0 machines, which read as a deployment too slow rather than one that
    cannot hold the examples at all."""
    quality, num_judged, not_judged = quality_ratio(judged)
    swept = terms["swept_prompt_tokens"]
    output = cell.shape.output_tokens
    reason = (
        f"{swept} prompt tokens (the cell's {cell.shape.prompt_tokens} and the examples') and "
        f"{output} output tokens exceed the model's context of {window}: every request "
        "would be refused"
    )
    return MethodResult(
        "in_context",
        {"correct_revision": None, "quality": quality, "latency": None, "isolation": None},
        None,
        0.0,
        cell.wall_s,
        {
            **terms,
            "quality_probes_judged": num_judged,
            "quality_probes_not_judged": not_judged,
            "not_served": reason,
        },
    )


def measure_in_context(
    ctx: BaselineContext, cell: CellTraffic, *, examples: int = DEFAULT_EXAMPLES
) -> MethodResult:
    """The cell's traffic on the base model with ``examples`` in-context examples per prompt,
    measured and priced."""
    if not cell.probes:
        return MethodResult(
            "in_context",
            dict.fromkeys(CHECKS),
            None,
            0.0,
            cell.wall_s,
            {"not_measured": "the cell has no probes to build examples from or judge"},
        )
    prompts = {probe: build_prompt(probe, cell.probes, examples) for probe in cell.probes}
    _measure(ctx, cell, prompts)
    cache = measure.RunCache(cache_of(ctx))
    extra = _extra_tokens(cache, prompts)
    if extra is None:
        raise RuntimeError(f"in-context prompt lengths of cell {cell.cell_id} were not measured")
    swept = _swept_prompt_tokens(cell, extra)
    judged: dict[Probe, bool | None] = {}
    for probe, prompt in prompts.items():
        entry = cache.get(_judgment_key(prompt, probe))
        judged[probe] = bool(entry["passed"]) if isinstance(entry, dict) else None
    terms: dict[str, object] = {
        "examples_per_prompt": examples,
        "examples_shown_mean": sum(len(p.examples) for p in prompts.values()) / len(prompts),
        "examples_same_adapter_mean": sum(p.same_adapter for p in prompts.values()) / len(prompts),
        "extra_prompt_tokens_per_request": extra,
        "swept_prompt_tokens": swept,
    }
    window = context_tokens(load_assets(ctx).base_model_dir)
    if swept + cell.shape.output_tokens > window:
        return _not_served(cell, judged, terms, window)
    raw = cache.get(_sweep_key(swept, cell.shape.output_tokens))
    if not isinstance(raw, dict):
        raise RuntimeError(f"no in-context load sweep at {swept} prompt tokens was recorded")
    levels = [measure.level_from_json(level) for level in raw["levels"]]
    terms["sweep_load_average_1m"] = raw["load_average_1m"]
    footprint = Footprint(levels, int(raw["peak_rss_bytes"]), machine_memory_bytes())
    return price_in_context(ctx.price, cell, footprint, judged, terms)
