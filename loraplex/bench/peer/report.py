"""``loraplex bench peer``'s figures: each side's statistics, the loraplex / vLLM ratios, the
JSON line and the human summary.

Rules (WORKLOADS.md): TTFT percentiles count every trace request, a failed or timed-out one at
the request timeout; a start that never answered counts at the start timeout; a completed ratio
stands beside every headline; a ratio with an unknown or non-positive side is None (null),
never 0. With several max_loras settings the headline of each ratio is its least favourable
setting for loraplex (named beside it); every setting's figures are under ``per_max_loras``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.bench.harness.machine import cpu_description, machine_record
from loraplex.bench.harness.stats import ratio
from loraplex.bench.peer.client import BatchResult
from loraplex.bench.peer.model import Lifetime, PeerBenchConfig, SettingRuns
from loraplex.bench.serve.summary import ttft_or_timeout
from loraplex.residency.stats import percentile

SIDES = ("loraplex", "vllm")  # the roles; the vLLM side may be a stand-in (config says which)


@dataclass(frozen=True)
class Headline:
    """One headline ratio: loraplex's figure over vLLM's."""

    name: str  # the ratio's key in the JSON line
    figure: str  # the side statistic it divides
    completed: str | None  # the side statistic that stands beside it
    higher_is_better: bool  # for loraplex: decides which setting is least favourable


HEADLINES = (
    Headline(
        "adapter_throughput_over_vllm", "adapter_tokens_per_s", "adapter_completed_ratio", True
    ),
    Headline("base_throughput_over_vllm", "base_tokens_per_s", "base_completed_ratio", True),
    Headline("common_rate_p99_ttft_over_vllm", "trace_p99_ttft_ms", "trace_completed_ratio", False),
    Headline(
        "start_to_first_answer_over_vllm",
        "start_to_first_answer_s",
        "first_answer_completed_ratio",
        False,
    ),
    Headline("peak_rss_over_vllm", "peak_rss_mib", None, False),
)


def _completed_ratio(done: int, total: int) -> float | None:
    return round(done / total, 4) if total else None


def _pooled(batches: Sequence[BatchResult]) -> float | None:
    return _completed_ratio(sum(b.completed for b in batches), sum(len(b.records) for b in batches))


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def ttft_ms(batches: Sequence[BatchResult], timeout_s: float, q: float) -> float | None:
    """The q-quantile TTFT (ms) over every request, failures at ``timeout_s``; None if none."""
    values = sorted(ttft_or_timeout(r, timeout_s) * 1000 for b in batches for r in b.records)
    return round(percentile(values, q), 2) if values else None


def side_stats(
    lifetimes: Sequence[Lifetime], expected: Sequence[str], timeout_s: float, start_timeout_s: float
) -> dict[str, Any]:
    """One side's figures over its lifetimes: medians of per-lifetime rates, pooled requests."""
    traces = [lt.trace for lt in lifetimes if lt.trace is not None]
    starts = [lt.first_answer_s for lt in lifetimes]
    peaks = [lt.peak_rss_bytes for lt in lifetimes if lt.peak_rss_bytes is not None]
    return {
        "adapter_tokens_per_s": _median([lt.adapter.tokens_per_s for lt in lifetimes]),
        "adapter_completed_ratio": _pooled([lt.adapter for lt in lifetimes]),
        "base_tokens_per_s": _median([lt.base.tokens_per_s for lt in lifetimes]),
        "base_completed_ratio": _pooled([lt.base for lt in lifetimes]),
        # completed adapter-batch requests/s of the first lifetime: what the trace rate used
        "capacity_rps": round(lifetimes[0].adapter.completed_per_s, 3) if lifetimes else None,
        "trace_p50_ttft_ms": ttft_ms(traces, timeout_s, 0.5),
        "trace_p99_ttft_ms": ttft_ms(traces, timeout_s, 0.99),
        "trace_completed_ratio": _pooled(traces),
        "trace_requests": sum(len(t.records) for t in traces),
        "start_to_first_answer_s": _median([start_timeout_s if s is None else s for s in starts]),
        "first_answer_completed_ratio": _completed_ratio(
            sum(s is not None for s in starts), len(starts)
        ),
        "peak_rss_mib": round(max(peaks) / (1 << 20), 1) if peaks else None,
        "probes_passed": min(
            (sum(a == e for a, e in zip(lt.probes, expected, strict=True)) for lt in lifetimes),
            default=0,
        ),
        "lifetimes": len(lifetimes),
    }


def greedy_matched(first: Lifetime | None, second: Lifetime | None) -> int:
    """Prompts whose continuation both sides gave, identically (first lifetimes compared)."""
    if first is None or second is None:
        return 0
    pairs = zip(first.greedy, second.greedy, strict=True)
    return sum(a is not None and a == b for a, b in pairs)


def setting_metrics(runs: SettingRuns, timeout_s: float, start_timeout_s: float) -> dict[str, Any]:
    """One max_loras setting: the ratios first, then correctness, then each side's figures."""
    by_side = {
        role: [lt for lt in runs.lifetimes if lt.label == label]
        for role, label in zip(SIDES, runs.labels, strict=True)
    }
    stats = {
        role: side_stats(lts, runs.expected, timeout_s, start_timeout_s)
        for role, lts in by_side.items()
    }
    out: dict[str, Any] = {"max_loras": runs.settings.max_loras}
    for h in HEADLINES:
        out[h.name] = ratio(stats["loraplex"][h.figure], stats["vllm"][h.figure])
    out["common_rate_rps"] = None if runs.trace_rate is None else round(runs.trace_rate, 3)
    out["probes"] = len(runs.expected)
    firsts = [lts[0] if lts else None for lts in by_side.values()]
    out["greedy_prompts"] = len(firsts[0].greedy) if firsts[0] is not None else 0
    out["greedy_matched"] = greedy_matched(firsts[0], firsts[1])
    out.update(stats)
    return out


def headline_metrics(per_setting: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each headline ratio at its least favourable setting (None if any setting has None),
    with that setting, both sides' figures and completed ratios; correctness at its worst."""
    out: dict[str, Any] = {}
    for h in HEADLINES:
        values = [s[h.name] for s in per_setting]
        if not values or None in values:
            out[h.name], chosen = None, (per_setting[0] if per_setting else None)
        else:
            pick = min if h.higher_is_better else max
            chosen = per_setting[values.index(pick(values))]
            out[h.name] = chosen[h.name]
        detail: dict[str, Any] = {"max_loras": None if chosen is None else chosen["max_loras"]}
        for role in SIDES:
            detail[role] = None if chosen is None else chosen[role][h.figure]
            if h.completed is not None:
                value = None if chosen is None else chosen[role][h.completed]
                detail[f"completed_ratio_{role}"] = value
        out[h.name.removesuffix("_over_vllm")] = detail
    out["probes"] = max((s["probes"] for s in per_setting), default=0)
    for role in SIDES:
        out[f"probes_passed_{role}"] = min(
            (s[role]["probes_passed"] for s in per_setting), default=0
        )
    out["greedy_prompts"] = max((s["greedy_prompts"] for s in per_setting), default=0)
    out["greedy_matched"] = min((s["greedy_matched"] for s in per_setting), default=0)
    out["per_max_loras"] = {str(s["max_loras"]): s for s in per_setting}
    return out


def peer_result(config: PeerBenchConfig, runs: Sequence[SettingRuns], peer: str) -> dict[str, Any]:
    """The JSON line's object: name, config (with what the other side was), seed, metrics."""
    from dataclasses import asdict

    record = {**asdict(config), "asset_dir": str(config.asset_dir), "peer": peer}
    record["logs_dir"] = str(config.logs_dir)
    record["cpu"] = cpu_description()
    record["machine"] = machine_record()
    record["max_loras"] = list(config.max_loras)
    timeouts = (config.request_timeout_s, config.start_timeout_s)
    metrics = headline_metrics([setting_metrics(r, *timeouts) for r in runs])
    return {"name": "peer", "config": record, "seed": config.seed, "metrics": metrics}


_ROWS = (
    ("adapter batch, output tokens/s", "adapter_tokens_per_s", "adapter_throughput_over_vllm"),
    ("adapter batch, completed", "adapter_completed_ratio", None),
    ("base batch, output tokens/s", "base_tokens_per_s", "base_throughput_over_vllm"),
    ("base batch, completed", "base_completed_ratio", None),
    ("zipf trace P50 TTFT (ms)", "trace_p50_ttft_ms", None),
    ("zipf trace P99 TTFT (ms)", "trace_p99_ttft_ms", "common_rate_p99_ttft_over_vllm"),
    ("zipf trace, completed", "trace_completed_ratio", None),
    ("start to first answer (s)", "start_to_first_answer_s", "start_to_first_answer_over_vllm"),
    ("peak RSS of the process tree (MiB)", "peak_rss_mib", "peak_rss_over_vllm"),
    ("probes passed", "probes_passed", None),
)


def summary_markdown(metrics: dict[str, Any], peer: str) -> str:
    """A table per setting: each figure for both sides and, for the headlines, the ratio."""
    parts = [f"# loraplex vs {peer}"]
    for key, s in metrics["per_max_loras"].items():
        lines = [
            f"## max_loras {key} (trace at {s['common_rate_rps']} req/s)",
            "| figure | loraplex | vLLM | loraplex / vLLM |",
            "|---|---|---|---|",
        ]
        for title, figure, name in _ROWS:
            cells = [s["loraplex"][figure], s["vllm"][figure], "" if name is None else s[name]]
            lines.append(f"| {title} | " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append(f"\ngreedy continuations identical: {s['greedy_matched']} of "
                     f"{s['greedy_prompts']} prompts")  # fmt: skip
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _cell(value: object) -> str:
    return "n/a" if value is None else str(value)
