"""A real fleet run's requests by what else was in flight, beside the simulator's
(docs/simulator.md, "Fleet hot-burst on Milan").

From ``bench sim --logs-dir``'s fleet client records alone (arrival, TTFT, TPOT, tier): for
each request, the others decoding (past their first token, not ended) and waiting (arrived,
before their first token) at the middle of its decode, and the TPOT medians by both counts with
a least-squares fit ``TPOT = a + b * decoding + c * waiting``; then the warm requests' (L0) time
outside their decode (TTFT less one TPOT: hop, wait, prefill) and TPOT by the requests in flight
at their arrival, real and simulated (``--cost-model``; with ``--line``, each trace priced by the
run's adjacent fleet passes as ``fleet_pairs.py`` prices it). ``--steps-only`` leaves the hops
unstretched by the contention curve.

    python scripts/sim-timeline/fleet_in_flight.py --logs-dir logs --cost-model fleet.json \
        --line run.json [--steps-only]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

BUCKETS = ((0, 2), (2, 5), (5, 9), (9, 13), (13, 10_000))  # requests in flight, [lo, hi)


@dataclass(frozen=True)
class Span:
    """One request: arrival, first token and end (seconds), its tier and TPOT (ms)."""

    t_s: float
    first_s: float
    end_s: float
    tier: str | None
    tpot_ms: float


def real_spans(records: Sequence[dict[str, Any]]) -> list[Span]:
    """The client records' completed requests (the end: the first token plus one TPOT per
    token after it)."""
    out = []
    for r in records:
        if r.get("ttft_s") is None or r.get("tpot_s") is None:
            continue
        first = r["t_s"] + r["ttft_s"]
        end = first + r["tpot_s"] * max(0, r["completion_tokens"] - 1)
        out.append(Span(r["t_s"], first, end, r.get("tier"), r["tpot_s"] * 1e3))
    return out


def decode_counts(spans: Sequence[Span]) -> list[tuple[int, int, float]]:
    """Per request: (others decoding, others waiting, its TPOT ms) at the middle of its decode."""
    out = []
    for s in spans:
        mid = (s.first_s + s.end_s) / 2
        decoding = sum(1 for o in spans if o is not s and o.first_s <= mid < o.end_s)
        waiting = sum(1 for o in spans if o is not s and o.t_s <= mid < o.first_s)
        out.append((decoding, waiting, s.tpot_ms))
    return out


def least_squares(rows: Sequence[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(a, b, c) of ``TPOT = a + b * decoding + c * waiting`` (normal equations, 3x3)."""
    xs = [(1.0, float(d), float(w)) for d, w, _ in rows]
    ys = [t for *_, t in rows]
    m = [[sum(x[i] * x[j] for x in xs) for j in range(3)] for i in range(3)]
    v = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) for i in range(3)]
    for col in range(3):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[pivot], v[col], v[pivot] = m[pivot], m[col], v[pivot], v[col]
        if m[col][col] == 0:
            raise ValueError("least_squares: the counts do not vary; no fit")
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=True)]
                v[r] -= f * v[col]
    a, b, c = (v[i] / m[i][i] for i in range(3))
    return a, b, c


def warm_by_arrival(spans: Sequence[Span]) -> dict[str, tuple[int, float | None, float | None]]:
    """Per bucket of requests in flight at arrival (others arrived and not ended): the warm
    (L0) requests' count, median TTFT less one TPOT and median TPOT (ms)."""
    out: dict[str, tuple[int, float | None, float | None]] = {}
    for lo, hi in BUCKETS:
        group = []
        for s in spans:
            if s.tier != "L0":
                continue
            flight = sum(1 for o in spans if o is not s and o.t_s <= s.t_s < o.end_s)
            if lo <= flight < hi:
                group.append(((s.first_s - s.t_s) * 1e3 - s.tpot_ms, s.tpot_ms))
        name = f"{lo}-{hi - 1}" if hi < 10_000 else f"{lo}+"
        out[name] = (
            len(group),
            round(statistics.median(x for x, _ in group), 1) if group else None,
            round(statistics.median(y for _, y in group), 1) if group else None,
        )
    return out


def main() -> None:
    from fleet_pairs import kept_models, run_parser
    from logs import logged_runs

    from loraplex.sim import cost_model as cost_file
    from loraplex.sim import cpu
    from loraplex.sim.config import SimConfig
    from loraplex.sim.outcome import Outcome
    from loraplex.sim.run import simulate

    parser = run_parser()
    parser.add_argument("--steps-only", action="store_true")
    args = parser.parse_args()
    if args.steps_only:
        cpu.CpuShare.hop_stretch = lambda self: 1.0  # type: ignore[method-assign]
    base = cost_file.load(args.cost_model)
    line = None if args.line is None else json.loads(args.line.read_text(encoding="utf-8"))
    models = kept_models(base, line, args.logs_dir) if line else {}
    logged = logged_runs(args.logs_dir, args.trace_requests, "fleet")
    pooled: list[tuple[int, int, float]] = []
    simulated: set[str] = set()
    for run in logged.runs:
        records = [json.loads(x) for x in run.path.read_text(encoding="utf-8").splitlines() if x]
        spans = real_spans(records)
        pooled.extend(decode_counts(spans))
        table = json.dumps(warm_by_arrival(spans))
        sys.stdout.write(f"{run.stem} real warm by in flight: {table}\n")
        if run.workload.name in simulated:
            continue  # the simulator's run of a trace is the same for every repeat
        simulated.add(run.workload.name)
        kept: list[Outcome] = []
        model = models.get(run.workload.name, base)
        simulate(run.trace, SimConfig(**logged.values), model, keep_outcomes=kept)
        sim = [
            Span(o.t_s, o.first_token_s, o.end_s, o.tier,
                 (o.end_s - o.first_token_s) / max(1, o.output_tokens - 1) * 1e3)
            for o in kept
            if o.first_token_s is not None and o.end_s is not None
        ]  # fmt: skip
        sys.stdout.write(f"{run.workload.name} sim warm by in flight: ")
        sys.stdout.write(f"{json.dumps(warm_by_arrival(sim))}\n")
    a, b, c = least_squares(pooled)
    sys.stdout.write(f"real TPOT ms = {a:.1f} + {b:.2f} * decoding + {c:.2f} * waiting\n")
    for lo, hi in BUCKETS[:4]:
        cells = []
        for wlo, whi in ((0, 1), (1, 4), (4, 8), (8, 10_000)):
            g = [t for d, w, t in pooled if lo <= d < hi and wlo <= w < whi]
            where = f"waiting {wlo}-{whi - 1}" if whi < 10_000 else f"waiting {wlo}+"
            cells.append(f"{where}: n {len(g)} {statistics.median(g):.1f}" if g else f"{where}: -")
        sys.stdout.write(f"decoding {lo}-{hi - 1}: {' | '.join(cells)}\n")


if __name__ == "__main__":
    main()
