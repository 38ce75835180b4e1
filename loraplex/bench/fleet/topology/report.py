"""``bench fleet --topology``'s figures: tokens per second without failures, each side's medians
with their spread, the headline ratios per repeat pair (null where undefined), the probe check
and the human table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.bench.fleet.repeats import aggregate, median_of, spread_of
from loraplex.bench.fleet.report import Headline, PolicyRun, headline_repeats, repeat_figures
from loraplex.bench.fleet.topology.config import SIDES, TOPOLOGY, UNMERGED
from loraplex.bench.fleet.topology.poller import Timeline
from loraplex.bench.harness.stats import ratio
from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.workloads import TraceRequest

HEADLINES = (
    Headline("tokens_per_s_topology_over_unmerged", "tokens_per_s", TOPOLOGY, UNMERGED, ">= 1.1"),
    Headline("p99_ttft_topology_over_unmerged", "p99_ttft_ms", TOPOLOGY, UNMERGED, "<= 1.1"),
)


def tokens_per_s(
    records: Sequence[RequestRecord], requests: Sequence[TraceRequest], wall_s: float
) -> dict[str, float | None]:
    """Completed requests' tokens (prompt + generated; generated alone) per second of the
    replay's wall time (its start to the last answer); a failed request adds nothing."""
    done = [(r, q) for r, q in zip(records, requests, strict=True) if r.ok]
    prompt = sum(q.prompt_tokens for _, q in done)
    generated = sum(r.completion_tokens for r, _ in done)
    return {
        "tokens_per_s": ratio(prompt + generated, wall_s, 2),
        "output_tokens_per_s": ratio(generated, wall_s, 2),
    }


@dataclass(frozen=True)
class SideRun:
    """One deployment of one side replaying one trace."""

    trace: str
    side: str
    requests: tuple[TraceRequest, ...]  # the trace replayed
    records: tuple[RequestRecord, ...]  # one per request, in trace order
    wall_s: float  # the replay's start to its last answer
    decisions: Mapping[str, int]
    timeline: Timeline
    probes: Mapping[str, str]  # revision (or "base") -> greedy text


def side_figures(run: SideRun, timeout_s: float) -> dict[str, Any]:
    """One run's figures: ``bench fleet``'s per-repeat figures (requests, completion, TTFT
    with failures at the timeout), tokens per second, decisions and the timeline."""
    base = repeat_figures(PolicyRun(run.trace, run.side, run.records, (), run.decisions), timeout_s)
    keep = ("requests", "completed", "completed_ratio", "ttft_ms")
    return {
        **{k: base[k] for k in keep},
        **tokens_per_s(run.records, run.requests, run.wall_s),
        "wall_s": round(run.wall_s, 2),
        "decisions": dict(sorted(run.decisions.items())),
        "merges": run.timeline.merges,
        "first_merged_decision_s": run.timeline.first_merged_decision_s,
        "transitions": run.timeline.transitions,
    }


MEDIANS = ("completed_ratio", "ttft_ms", "tokens_per_s", "output_tokens_per_s")


def topology_metrics(
    runs: Sequence[SideRun], traces: Sequence[str], timeout_s: float
) -> dict[str, Any]:
    """Per trace: each side's medians (with their spread) and per-repeat figures, and the
    headline ratios per repeat pair (median, [min, max], per repeat; None where undefined)."""
    out: dict[str, Any] = {}
    for trace in traces:
        figures = {
            side: [side_figures(r, timeout_s) for r in runs if r.trace == trace and r.side == side]
            for side in SIDES
        }
        m: dict[str, Any] = {}
        for h in HEADLINES:
            values = headline_repeats(figures, h)
            m[h.name] = median_of(values, 3)
            m.setdefault("spread", {})[h.name] = spread_of(values)
            m.setdefault("per_repeat", {})[h.name] = values
        m["sides"] = {
            side: {"runs": len(f), **aggregate(f, MEDIANS), "repeats": f}
            for side, f in figures.items()
            if f
        }
        out[trace] = m
    return out


def probe_check(runs: Sequence[SideRun]) -> dict[str, Any]:
    """Every probe's output compared over every run: the count identical everywhere and each
    one that differs (its outputs by run)."""
    names = sorted({name for run in runs for name in run.probes})
    mismatches = []
    for name in names:
        outputs = {f"{r.trace}/{r.side}#{i}": r.probes.get(name) for i, r in enumerate(runs)}
        if len(set(outputs.values())) != 1:
            mismatches.append({"probe": name, "outputs": outputs})
    return {"probes": len(names), "runs": len(runs), "identical": len(names) - len(mismatches),
            "mismatches": mismatches}  # fmt: skip


def topology_table(result: Mapping[str, Any]) -> str:
    """The human summary: per trace, one row per side (medians [min-max]), the headline ratios
    with their spread, each side's decisions and merges; then the probes and the rate."""
    m = result["metrics"]
    lines = [f"rate {m['trace_rate']} req/s (capacity bursts {m['capacity_rps']})"]
    for trace in result["config"]["traces"]:
        t = m[trace]
        lines.append(f"{trace} (hot token share {m['hot_token_share'][trace]}):")
        for side, s in t["sides"].items():
            spread = s["spread"]
            lines.append(
                f"  {side:<14} tokens/s {s['tokens_per_s']} {spread['tokens_per_s']}"
                f"  ttft p50 {s['ttft_ms']['p50']} ms  p99 {s['ttft_ms']['p99']} ms "
                f"{spread['ttft_ms']['p99']}  done {s['completed_ratio']}"
            )
            for i, rep in enumerate(s["repeats"]):
                lines.append(
                    f"    #{i} decisions {rep['decisions']} merges {rep['merges']} "
                    f"first merged decision {rep['first_merged_decision_s']} s"
                )
        for h in HEADLINES:
            lines.append(
                f"  {h.name} {t[h.name]} {t['spread'][h.name]} (issue's target {h.target})"
            )
    p = m["probes"]
    lines.append(f"probes: {p['identical']} of {p['probes']} identical over {p['runs']} runs")
    return "\n".join(lines)
