"""``loraplex bench peer``'s figures: each server kind's statistics, the ratios with their
spread over rounds, and the JSON line (the human summary is in ``peer.summary``).

Rules (WORKLOADS.md): TTFT percentiles count every trace request, a failed or timed-out one at
the request timeout; a start that never answered counts at the start timeout; a completed ratio
stands beside every headline; a ratio with an unknown or non-positive side is None (null),
never 0. A ratio's value divides the kinds' figures over all their lifetimes (medians of
per-lifetime rates, pooled trace requests, the largest memory peak); ``<name>_min`` and
``<name>_max`` beside it are the smallest and largest per-round ratio (round r: each kind's
r-th lifetime; a round where a figure was not measured, e.g. the trace before both rates were
known, is left out; null if any round's ratio is), ``<name>_median`` their median. NOTE: the
value and the per-round ratios can disagree, most for the trace's P99 (all lifetimes' requests
pooled): run 17 in docs/benchmarks/peer.md read 0.104 beside a per-round 0.086-0.097, so the
per-round median stands beside them (without it the JSON gave no median of the rounds).
With several max_loras settings the headline of each ratio is its least favourable setting for
loraplex (named beside it); every setting's figures are under ``per_max_loras``.
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

# The kinds' roles, in SettingRuns.labels order; the vLLM kinds may be stand-ins (config says).
ROLES = ("loraplex", "vllm", "vllm_nolora")
SIDES = ROLES[:2]  # the two that serve adapters
MIB = 1 << 20
COMPLETED = {  # the completed ratio that stands beside each figure
    "adapter_tokens_per_s": "adapter_completed_ratio",
    "base_tokens_per_s": "base_completed_ratio",
    "trace_p99_ttft_ms": "trace_completed_ratio",
    "start_to_first_answer_s": "first_answer_completed_ratio",
}


@dataclass(frozen=True)
class Headline:
    """One headline ratio: loraplex's ``figure`` over the largest of the ``over`` figures."""

    name: str  # the ratio's key in the JSON line
    figure: str  # loraplex's statistic on top
    over: tuple[tuple[str, str, str], ...]  # (key in the detail, role, statistic) below
    higher_is_better: bool  # for loraplex: decides which setting is least favourable

    @property
    def detail(self) -> str:
        """The key of the figures behind the headline: the name without ``_over_vllm`` (the
        keys older readers know), else with ``_over_`` cut to ``_``."""
        if self.name.endswith("_over_vllm"):
            return self.name.removesuffix("_over_vllm")
        return self.name.replace("_over_", "_")


def _vs(role: str, figure: str) -> tuple[tuple[str, str, str], ...]:
    return ((role, role, figure),)


_BASE = "base_tokens_per_s"
HEADLINES = (
    Headline(
        "adapter_throughput_over_vllm",
        "adapter_tokens_per_s",
        _vs("vllm", "adapter_tokens_per_s"),
        True,
    ),
    Headline("base_throughput_over_vllm", _BASE, _vs("vllm", _BASE), True),
    Headline("base_throughput_over_vllm_nolora", _BASE, _vs("vllm_nolora", _BASE), True),
    Headline(
        "adapter_traffic_over_best_base",
        "adapter_tokens_per_s",
        tuple((f"{role}_base", role, _BASE) for role in ROLES),
        True,
    ),
    Headline(
        "common_rate_p99_ttft_over_vllm",
        "trace_p99_ttft_ms",
        _vs("vllm", "trace_p99_ttft_ms"),
        False,
    ),
    Headline(
        "start_to_first_answer_over_vllm",
        "start_to_first_answer_s",
        _vs("vllm", "start_to_first_answer_s"),
        False,
    ),
    Headline("peak_rss_over_vllm", "peak_rss_mib", _vs("vllm", "peak_rss_mib"), False),
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


def _probes_passed(lifetimes: Sequence[Lifetime], expected: Sequence[str | None]) -> int | None:
    """The worst lifetime's count of probes answered as expected (unchecked ones never pass);
    None for a kind that ran no probes."""
    counts = [
        sum(e is not None and a == e for a, e in zip(lt.probes, expected, strict=True))
        for lt in lifetimes
        if lt.probes
    ]
    return min(counts) if counts else None


def side_stats(
    lifetimes: Sequence[Lifetime],
    expected: Sequence[str | None],
    timeout_s: float,
    start_timeout_s: float,
) -> dict[str, Any]:
    """One kind's figures over its lifetimes: medians of per-lifetime rates, pooled requests
    (None where the kind ran no such workload)."""
    adapters = [lt.adapter for lt in lifetimes if lt.adapter is not None]
    traces = [lt.trace for lt in lifetimes if lt.trace is not None]
    starts = [lt.first_answer_s for lt in lifetimes]
    peaks = [lt.peak_rss_bytes for lt in lifetimes if lt.peak_rss_bytes is not None]
    return {
        "adapter_tokens_per_s": _median([b.tokens_per_s for b in adapters]),
        "adapter_completed_ratio": _pooled(adapters),
        "base_tokens_per_s": _median([lt.base.tokens_per_s for lt in lifetimes]),
        "base_completed_ratio": _pooled([lt.base for lt in lifetimes]),
        # completed adapter-batch requests/s of the first lifetime: what the trace rate used
        "capacity_rps": round(adapters[0].completed_per_s, 3) if adapters else None,
        "trace_p50_ttft_ms": ttft_ms(traces, timeout_s, 0.5),
        "trace_p99_ttft_ms": ttft_ms(traces, timeout_s, 0.99),
        "trace_completed_ratio": _pooled(traces),
        "trace_requests": sum(len(t.records) for t in traces),
        "start_to_first_answer_s": _median([start_timeout_s if s is None else s for s in starts]),
        "first_answer_completed_ratio": _completed_ratio(
            sum(s is not None for s in starts), len(starts)
        ),
        "peak_rss_mib": round(max(peaks) / MIB, 1) if peaks else None,
        "probes_passed": _probes_passed(lifetimes, expected),
        "lifetimes": len(lifetimes),
    }


def lifetime_figure(
    lifetime: Lifetime, figure: str, timeout_s: float, start_timeout_s: float
) -> float | None:
    """One lifetime's value of a side statistic; None where it was not measured."""
    if figure == "adapter_tokens_per_s":
        return None if lifetime.adapter is None else lifetime.adapter.tokens_per_s
    if figure == "base_tokens_per_s":
        return lifetime.base.tokens_per_s
    if figure == "trace_p99_ttft_ms":
        return None if lifetime.trace is None else ttft_ms([lifetime.trace], timeout_s, 0.99)
    if figure == "start_to_first_answer_s":
        first = lifetime.first_answer_s
        return start_timeout_s if first is None else first
    if figure == "peak_rss_mib":
        peak = lifetime.peak_rss_bytes
        return None if peak is None else peak / MIB
    raise ValueError(f"figure {figure!r} is invalid; expected one of the headline statistics")


def _largest(values: Sequence[float | None]) -> float | None:
    """The largest value; None if any is unknown or not > 0 (a failed kind's figure must not
    leave a smaller "best" that flatters the ratio)."""
    if not values or any(v is None or not v > 0 for v in values):
        return None
    return max(v for v in values if v is not None)


def round_spread(
    h: Headline, rounds: Sequence[dict[str, Lifetime]], timeout_s: float, start_timeout_s: float
) -> tuple[float | None, float | None, float | None]:
    """The smallest, median and largest per-round ratio of ``h``; rounds where a figure was not
    measured are left out; (None, None, None) if none is left or any ratio is undefined."""
    values = []
    for by_role in rounds:
        top = lifetime_figure(by_role["loraplex"], h.figure, timeout_s, start_timeout_s)
        below = [lifetime_figure(by_role[r], f, timeout_s, start_timeout_s) for _, r, f in h.over]
        if top is None or None in below:
            continue
        values.append(ratio(top, _largest(below)))
    if not values or None in values:
        return None, None, None
    found = [v for v in values if v is not None]
    return min(found), _median(found), max(found)


def greedy_matched(first: Lifetime | None, second: Lifetime | None) -> int:
    """Prompts whose continuation both sides gave, identically (first lifetimes compared)."""
    if first is None or second is None:
        return 0
    pairs = zip(first.greedy, second.greedy, strict=True)
    return sum(a is not None and a == b for a, b in pairs)


def _headline_value(h: Headline, stats: dict[str, dict[str, Any]]) -> float | None:
    below = [stats[role][figure] for _, role, figure in h.over]
    return ratio(stats["loraplex"][h.figure], _largest(below))


def setting_metrics(runs: SettingRuns, timeout_s: float, start_timeout_s: float) -> dict[str, Any]:
    """One max_loras setting: the ratios (each with its spread) first, then correctness, then
    each kind's figures."""
    by_role = {
        role: [lt for lt in runs.lifetimes if lt.label == label]
        for role, label in zip(ROLES, runs.labels, strict=False)
    }
    stats = {
        role: side_stats(lts, runs.expected, timeout_s, start_timeout_s)
        for role, lts in by_role.items()
    }
    count = min(len(lts) for lts in by_role.values())
    rounds = [{role: lts[r] for role, lts in by_role.items()} for r in range(count)]
    out: dict[str, Any] = {"max_loras": runs.settings.max_loras}
    for h in HEADLINES:
        spread: tuple[float | None, float | None, float | None] = (None, None, None)
        if any(role not in stats for _, role, _ in h.over):  # that kind did not run
            out[h.name] = None
        else:
            out[h.name] = _headline_value(h, stats)
            spread = round_spread(h, rounds, timeout_s, start_timeout_s)
        out[f"{h.name}_min"], out[f"{h.name}_median"], out[f"{h.name}_max"] = spread
    out["rounds"] = count
    out["common_rate_rps"] = None if runs.trace_rate is None else round(runs.trace_rate, 3)
    out["probes"] = sum(e is not None for e in runs.expected)
    firsts = [lts[0] if lts else None for lts in (by_role["loraplex"], by_role["vllm"])]
    out["greedy_prompts"] = len(firsts[0].greedy) if firsts[0] is not None else 0
    out["greedy_matched"] = greedy_matched(firsts[0], firsts[1])
    out.update(stats)
    return out


def _detail(h: Headline, chosen: dict[str, Any] | None) -> dict[str, Any]:
    """The chosen setting's figures behind ``h``: loraplex's and each one below, each with its
    completed ratio where it has one."""
    detail: dict[str, Any] = {"max_loras": None if chosen is None else chosen["max_loras"]}
    for key, role, figure in (("loraplex", "loraplex", h.figure), *h.over):
        side = None if chosen is None else chosen.get(role)
        detail[key] = None if side is None else side[figure]
        if figure in COMPLETED:
            detail[f"completed_ratio_{key}"] = None if side is None else side[COMPLETED[figure]]
    return detail


def headline_metrics(per_setting: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each headline ratio at its least favourable setting (None if any setting has None),
    with its spread, that setting, the figures behind it and their completed ratios;
    correctness at its worst."""
    out: dict[str, Any] = {}
    for h in HEADLINES:
        values = [s[h.name] for s in per_setting]
        chosen = per_setting[0] if per_setting else None
        if values and None not in values:
            pick = min if h.higher_is_better else max
            chosen = per_setting[values.index(pick(values))]
        defined = chosen is not None and None not in values
        for suffix in ("", "_min", "_median", "_max"):
            out[h.name + suffix] = chosen[h.name + suffix] if defined and chosen else None
        out[h.detail] = _detail(h, chosen)
    out["probes"] = max((s["probes"] for s in per_setting), default=0)
    for role in SIDES:
        passed = [s[role]["probes_passed"] for s in per_setting]
        out[f"probes_passed_{role}"] = None if None in passed else min(passed, default=0)
    out["greedy_prompts"] = max((s["greedy_prompts"] for s in per_setting), default=0)
    out["greedy_matched"] = min((s["greedy_matched"] for s in per_setting), default=0)
    out["rounds"] = min((s["rounds"] for s in per_setting), default=0)
    out["per_max_loras"] = {str(s["max_loras"]): s for s in per_setting}
    return out


def peer_result(config: PeerBenchConfig, runs: Sequence[SettingRuns], peer: str) -> dict[str, Any]:
    """The JSON line's object: name, config (with what the other side was), seed, metrics."""
    from dataclasses import asdict

    record = {**asdict(config), "asset_dir": str(config.asset_dir), "peer": peer}
    record["logs_dir"] = str(config.logs_dir)
    record["adapter_mix"] = config.mix
    record["cpu"] = cpu_description()
    record["machine"] = machine_record()
    record["max_loras"] = list(config.max_loras)
    timeouts = (config.request_timeout_s, config.start_timeout_s)
    metrics = headline_metrics([setting_metrics(r, *timeouts) for r in runs])
    return {"name": "peer", "config": record, "seed": config.seed, "metrics": metrics}
