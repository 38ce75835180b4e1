"""The per-kind result of issue 25's attacker kinds: what each cost the victims.

Per kind, over its attacked runs against its calm runs (the pooled victims' requests of each
side): failed requests, the victims' P99 TTFT attacked over calm, the server's memory growth,
and whether the kind's targets hold. Memory: the server process tree's RSS grows by tens of MiB
in a calm run too (the victims' adapters loaded into the CPU cache, the engine's first steps),
so what an attack costs is its run's growth beyond the calm run's, the figure judged (largest
attacked growth minus largest calm growth over the rounds); the raw growths stand beside it.
As everywhere in ``bench serve``, a failed request counts in the percentile at the request
timeout, and an undefined value is ``None`` (``null``), never 0.

One exception, issue 25's own: under ``hung-engine`` a 503 is the answer the server should give
while its engine is stopped. Those are taken out of the failed count and the percentile and
reported on their own (how many, and the slowest from arrival to the reply), with their own
target (none slower than ``MAX_503_S``). Only a 503 of an attacked run, to a request in flight
during the stop (give or take ``MAX_503_S``, from the attack's tally), is excused: one in the
calm run, or long before or after the stop, is a failure. Under every other kind a 503 is a
failure like any.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.bench.harness.stats import ratio
from loraplex.bench.serve.adversarial import victim_failed
from loraplex.bench.serve.attack_kinds import HALF_OPEN_FLOOD, HUNG_ENGINE, STUCK_STREAM
from loraplex.bench.serve.attack_runs import KindRun
from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.workloads import Workload
from loraplex.residency.stats import percentile

MAX_P99_TTFT_RATIO = 1.5  # victims' P99 TTFT attacked / calm, every kind
MAX_503_S = 1.0  # hung-engine: arrival to a 503's reply
MAX_RSS_GROWTH_MIB = 16.0  # stuck-stream: server tree RSS growth beyond the calm run's
# half-open-flood: the flood must have held at least this many sockets open at once in every
# attacked run (the benchmark server's unauthenticated budget: half of its 1,024 connections),
# or the attack was not delivered and the kind's verdict is undefined (``met`` null), however
# calm the victims were: an attacker too slow to fill the budget proves nothing.
FLOOD_MUST_HOLD = 512
_MIB = 1 << 20


@dataclass(frozen=True)
class Side:
    """The victims' requests of one side (calm or attacked) of one kind, pooled over rounds."""

    requests: int  # victims' requests, excused 503s included
    failed: int  # failed ones (excused 503s not)
    p99_ttft_ms: float | None  # P99 TTFT, failures at the timeout; None without a request
    excused_503: int  # hung-engine's 503s (0 elsewhere: there a 503 is a failure)
    max_503_ms: float | None  # the slowest of them, arrival to reply; None without one
    rss_growth_mib: float | None  # largest server tree RSS growth of the side's runs
    server_cpu_s: float  # the server tree's CPU seconds over the side's runs, summed
    client_cpu_s: float  # the victims' client's CPU seconds (the benchmark's process), summed
    attacker_cpu_s: float | None  # the attack's own process's CPU seconds, summed; None: calm


def side(
    runs: Sequence[KindRun], workload: Workload, timeout_s: float, *, excuse_503: bool
) -> Side:
    """The victims' figures over ``runs`` (one side of one kind)."""
    ttfts: list[float] = []
    failed, latencies = 0, []
    for run in runs:
        window = hang_window(run) if excuse_503 else None
        for record, request in zip(run.records, workload.requests, strict=True):
            if window is not None and record.status == 503 and _during(record, window, timeout_s):
                latencies.append(timeout_s if record.reply_s is None else record.reply_s)
                continue
            bad = victim_failed(record, request)
            failed += bad
            ttfts.append(timeout_s if bad or record.ttft_s is None else record.ttft_s)
    growth = max((run.rss_growth_bytes for run in runs), default=None)
    return Side(
        requests=len(ttfts) + len(latencies),
        failed=failed,
        p99_ttft_ms=_ms(percentile(sorted(ttfts), 0.99)) if ttfts else None,
        excused_503=len(latencies),
        max_503_ms=_ms(max(latencies)) if latencies else None,
        rss_growth_mib=None if growth is None else round(growth / _MIB, 2),
        server_cpu_s=round(sum(run.cpu.server_s for run in runs), 2),
        client_cpu_s=round(sum(run.cpu.client_s for run in runs), 2),
        attacker_cpu_s=_sum_defined(run.cpu.attacker_s for run in runs),
    )


def _sum_defined(values: Iterable[float | None]) -> float | None:
    """The sum of the defined values, rounded; None when none is defined."""
    defined = [value for value in values if value is not None]
    return round(sum(defined), 2) if defined else None


def hang_window(run: KindRun) -> tuple[float, float] | None:
    """When a 503 answers a stopped engine in a hung-engine run (seconds from the run's start):
    the stop as the attack's tally recorded it, widened by ``MAX_503_S`` on each side (the
    verdict and the recovery take that long at most); None: never (a calm run)."""
    started_s, stopped_s = run.attacker.get("started_s"), run.attacker.get("stopped_s")
    if not run.attacked or started_s is None or stopped_s is None:
        return None
    return started_s - MAX_503_S, started_s + stopped_s + MAX_503_S


def _during(record: RequestRecord, window: tuple[float, float], timeout_s: float) -> bool:
    """Whether ``record``'s request was in flight at some time within ``window``."""
    reply_s = timeout_s if record.reply_s is None else record.reply_s
    return record.t_s <= window[1] and record.t_s + reply_s >= window[0]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def kind_entry(
    kind: str, runs: Sequence[KindRun], workload: Workload, timeout_s: float
) -> dict[str, Any]:
    """One kind's entry of the JSON line (its runs: both sides, every round)."""
    hung = kind == HUNG_ENGINE
    attacked = side([r for r in runs if r.attacked], workload, timeout_s, excuse_503=hung)
    calm = side([r for r in runs if not r.attacked], workload, timeout_s, excuse_503=hung)
    p99_ratio = ratio(attacked.p99_ttft_ms, calm.p99_ttft_ms)
    growth, calm_growth = attacked.rss_growth_mib, calm.rss_growth_mib
    entry: dict[str, Any] = {
        "victim_requests": attacked.requests,
        "victim_failed": attacked.failed,
        "victim_failed_calm": calm.failed,
        "victim_p99_ttft_ratio": p99_ratio,
        "victim_p99_ttft_ms_attacked": attacked.p99_ttft_ms,
        "victim_p99_ttft_ms_calm": calm.p99_ttft_ms,
        "victim_503": attacked.excused_503 if hung else None,
        "victim_503_calm": calm.excused_503 if hung else None,
        "victim_503_max_ms": attacked.max_503_ms,
        "server_rss_growth_mib_over_calm": (
            None if growth is None or calm_growth is None else round(growth - calm_growth, 2)
        ),
        "server_rss_growth_mib": growth,
        "server_rss_growth_mib_calm": calm_growth,
        "server_cpu_s": attacked.server_cpu_s,
        "server_cpu_s_calm": calm.server_cpu_s,
        "client_cpu_s": attacked.client_cpu_s,
        "client_cpu_s_calm": calm.client_cpu_s,
        "attacker_cpu_s": attacked.attacker_cpu_s,
    }
    checks = [attacked.failed == 0, None if p99_ratio is None else p99_ratio <= MAX_P99_TTFT_RATIO]
    if hung:
        checks.append(attacked.max_503_ms is None or attacked.max_503_ms <= MAX_503_S * 1000)
    if kind == STUCK_STREAM:
        over = entry["server_rss_growth_mib_over_calm"]
        checks.append(None if over is None else over <= MAX_RSS_GROWTH_MIB)
    if kind == HALF_OPEN_FLOOD:
        peaks = [r.attacker.get("peak_open", 0) for r in runs if r.attacked]
        entry["attack_delivered"] = bool(peaks) and min(peaks) >= FLOOD_MUST_HOLD
        checks.append(True if entry["attack_delivered"] else None)
    entry["met"] = met(checks)
    entry["attacker"] = [r.attacker for r in runs if r.attacked]
    return entry


def met(checks: Sequence[bool | None]) -> bool | None:
    """False when any check fails; None when none fails but one is undefined; else True."""
    if any(check is False for check in checks):
        return False
    return None if any(check is None for check in checks) else True


def kind_metrics(
    runs: Sequence[KindRun], workload: Workload, timeout_s: float
) -> dict[str, dict[str, Any]]:
    """``adversarial_kinds``: each kind's entry, in the order its runs ran."""
    kinds = list(dict.fromkeys(run.kind for run in runs))
    return {kind: kind_entry(kind, [r for r in runs if r.kind == kind], workload, timeout_s)
            for kind in kinds}  # fmt: skip
