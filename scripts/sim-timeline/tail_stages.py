"""A real single server's slowest requests beside the simulator's, stage by stage (issue 30).

Reads ``logs.py --out``'s paired rows (one per request: the real request log's ``engine``
timeline and the simulator's, ``probe.simulated_outcomes``) and, per trace, takes the slowest
``--fraction`` of requests by real TTFT (and, separately, by simulated TTFT). For each group it
prints the medians, ms, of: TTFT; the hop outside the engine (real: client TTFT less the
engine's first step end; simulated: the modelled hop plus the way out); the engine's ask;
ask -> ready (the load and any queue before it) with the load's own stage seconds and the
queue (ask -> ready less the stage seconds); ready -> lease; the room wait; lease -> plan; the
first step (plan -> its end). Also, for the real slowest, each request's row, so what sets
the tail can be read one by one. With ``--band 0.4,0.6`` (simp50-p50) it prints instead the same
medians for the requests between those quantiles of the real TTFT (and, separately, of the
simulated TTFT), and the medians per leased tier of the real band, to read what sets the P50.

    python scripts/sim-timeline/tail_stages.py --rows rows.jsonl [--fraction 0.05] \
        [--trace cold-storm] [--band 0.4,0.6]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any


def _ms(e: dict[str, Any] | None, name: str) -> float | None:
    if not e or e.get(name) is None:
        return None
    return float(e[name]) * 1e3


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def stages(row: dict[str, Any]) -> dict[str, float | None]:
    """One paired row's stages, ms: real (``r_``) and simulated (``s_``)."""
    e, m = row["engine"], row["sim_engine"]
    asked, ready, lease = _ms(e, "asked_s"), _ms(e, "ready_s"), _ms(e, "lease_s")
    load = _ms(e, "load_s")
    fse = _ms(e, "first_step_end_s")
    s_fse, s_hop = _ms(m, "first_step_end_s"), _ms(m, "hop_s")
    s_ttft = row["sim_ttft_ms"]
    return {
        "r_ttft": row["real_ttft_ms"],
        "s_ttft": s_ttft,
        "r_outside": _diff(fse, row["real_ttft_ms"]),
        "s_outside": None if s_ttft is None or s_fse is None else s_ttft - s_fse,
        "s_hop": s_hop,
        "r_asked": asked,
        "r_ask_ready": _diff(asked, ready),
        "r_load": load,
        "r_queue": None if ready is None or asked is None or load is None else ready - asked - load,
        "r_ready_lease": _diff(ready, lease),
        "r_room_wait": _ms(e, "room_wait_s"),
        "r_lease": lease,
        "s_lease": _ms(m, "lease_s"),
        "r_lease_plan": _diff(lease, _ms(e, "scheduled_s")),
        "s_lease_plan": _diff(_ms(m, "lease_s"), _ms(m, "scheduled_s")),
        "r_first_step": _diff(_ms(e, "scheduled_s"), fse),
        "s_first_step": _diff(_ms(m, "scheduled_s"), s_fse),
    }


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    parts = [stages(r) for r in rows]
    for name in parts[0] if parts else ():
        kept = [p[name] for p in parts if p[name] is not None]
        out[name] = round(statistics.median(kept), 2) if kept else None
    return out


def slowest(rows: list[dict[str, Any]], key: str, fraction: float) -> list[dict[str, Any]]:
    kept = [r for r in rows if r[key] is not None]
    n = max(1, math.ceil(len(kept) * fraction))
    return sorted(kept, key=lambda r: r[key], reverse=True)[:n]


def band(rows: list[dict[str, Any]], key: str, lo: float, hi: float) -> list[dict[str, Any]]:
    """The rows whose ``key`` ranks between the ``lo`` and ``hi`` quantiles (by rank in the
    sorted order, both ends kept; at least the middle row)."""
    kept = sorted((r for r in rows if r[key] is not None), key=lambda r: r[key])
    if not kept:
        return []
    n = len(kept)
    first = min(n - 1, math.floor(lo * (n - 1)))
    last = max(first, math.ceil(hi * (n - 1)))
    return kept[first : last + 1]


def _print_band(group: list[dict[str, Any]], trace: str, lo: float, hi: float) -> None:
    real = band(group, "real_ttft_ms", lo, hi)
    sim = band(group, "sim_ttft_ms", lo, hi)
    sys.stdout.write(f"{trace} real band {lo}-{hi} {json.dumps(medians(real))}\n")
    sys.stdout.write(f"{trace} sim band {lo}-{hi} {json.dumps(medians(sim))}\n")
    for tier in sorted({str(r["real_tier"]) for r in real}):
        part = [r for r in real if str(r["real_tier"]) == tier]
        sys.stdout.write(f"{trace} real band tier {tier} {json.dumps(medians(part))}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=Path, required=True)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--trace", default=None)
    parser.add_argument("--band", default=None, help="LO,HI quantiles of TTFT, e.g. 0.4,0.6")
    args = parser.parse_args()
    quantiles = None if args.band is None else [float(x) for x in args.band.split(",")]
    if quantiles is not None and not (
        len(quantiles) == 2 and 0 <= quantiles[0] <= quantiles[1] <= 1
    ):
        parser.error("--band takes LO,HI with 0 <= LO <= HI <= 1")
    rows = [json.loads(x) for x in args.rows.read_text(encoding="utf-8").splitlines() if x]
    traces = sorted({r["run"].split("-", 2)[2] for r in rows})
    for trace in traces:
        if args.trace is not None and trace != args.trace:
            continue
        group = [r for r in rows if r["run"].split("-", 2)[2] == trace]
        if quantiles is not None:
            sys.stdout.write(f"{trace} all {json.dumps(medians(group))}\n")
            _print_band(group, trace, quantiles[0], quantiles[1])
            continue
        real = slowest(group, "real_ttft_ms", args.fraction)
        sim = slowest(group, "sim_ttft_ms", args.fraction)
        sys.stdout.write(f"{trace} all {json.dumps(medians(group))}\n")
        sys.stdout.write(f"{trace} real slowest {json.dumps(medians(real))}\n")
        sys.stdout.write(f"{trace} sim slowest {json.dumps(medians(sim))}\n")
        for r in real:
            s = {k: None if v is None else round(v, 2) for k, v in stages(r).items()}
            sys.stdout.write(
                f"  {r['run']} t {r['t_s']:.3f} {r['adapter']} tier {r['real_tier']}/"
                f"{r['sim_tier']} {json.dumps(s)}\n"
            )


if __name__ == "__main__":
    main()
