"""What hot-burst's TTFT is made of, per run, from ``bench serve --logs-dir``.

Reads each run's server request log (``run<NN>-hot-burst@<slots>-<policy>.requests.jsonl``, the
engine's stages of every request) and the client's records (``.client.jsonl``), and splits the
server-side TTFT of each request into (ms):

- ``pre_ask``: engine arrival to its lease being asked for (queued outside the lease window:
  the fair order, the class seat caps, the cold-load quota);
- ``lease``: asked to leased (0 for an adapter in a slot; else the load and its wait for room);
- ``seat``: leased to the first step that carried it (waiting for a seat or a step's tokens);
- ``step``: that first step (the prefill, with whatever else the step ran);
- ``out``: the rest of the server's TTFT (front, the hops, the token's way out).

Per run and tenant (the prio tenant from the sweep on, the headline's window; the batch tenant
whole): TTFT P50 / P99 (client and server), the tier the lease found, the mean of every stage
over all requests and over the tail (server TTFT at or above the tenant's P95), and for the
tail, the batch requests holding a lease (a GPU slot) when the tail request asked for its own.
One JSON object per run.

    PYTHONPATH=. python scripts/hot-burst-stages/stages.py --logs-dir /tmp/logs --duration-s 30
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from loraplex.bench.workloads import HOT_BURST_SWEEP_TENANT, HOT_BURST_WINDOW

HOT_TENANT = "prio"
STAGES = ("pre_ask", "lease", "seat", "step", "out")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _q(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (``bench serve``'s headline percentiles interpolate, so
    they can differ by a few percent on a tail of a few requests)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def stages_ms(line: dict[str, Any]) -> dict[str, float] | None:
    """The five stages of one request (ms); None without a first step or a TTFT."""
    e, ttft = line.get("engine"), line.get("ttft_s")
    if e is None or ttft is None or e.get("first_step_end_s") is None:
        return None
    asked = e["asked_s"] if e.get("asked_s") is not None else e["scheduled_s"]
    leased = e["lease_s"] if e.get("lease_s") is not None else asked
    points = (0.0, asked, leased, e["scheduled_s"], e["first_step_end_s"], ttft)
    return {s: 1e3 * (b - a) for s, a, b in zip(STAGES, points, points[1:], strict=False)}


def _slot_holders(batch: list[dict[str, Any]], at_s: float) -> int:
    """GPU slots the batch tenant's leases held at ``at_s`` (the server log's clock): its
    distinct adapters with a request between its lease and its end (requests on one adapter
    share its slot)."""
    held = set()
    for line in batch:
        e = line.get("engine") or {}
        if e.get("lease_s") is None:
            continue
        if line["t_s"] + e["lease_s"] <= at_s < line["t_s"] + e["end_s"]:
            held.add(line["adapter"])
    return len(held)


def tenant_view(lines: list[dict[str, Any]], batch: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [(x, stages_ms(x)) for x in lines]
    done = [(x, s) for x, s in rows if s is not None]
    ttfts = [1e3 * x["ttft_s"] for x, _ in done]
    p95 = _q(ttfts, 0.95)
    tail = [(x, s) for x, s in done if p95 is not None and 1e3 * x["ttft_s"] >= p95]
    tiers: dict[str, int] = {}
    for x, _ in done:
        tiers[str(x.get("tier"))] = tiers.get(str(x.get("tier")), 0) + 1
    out: dict[str, Any] = {
        "n": len(lines),
        "first_token": len(done),
        "server_ttft_p50_ms": _round(_q(ttfts, 0.5)),
        "server_ttft_p99_ms": _round(_q(ttfts, 0.99)),
        "tiers": tiers,
        "mean_ms": {k: _round(statistics.fmean(s[k] for _, s in done)) for k in STAGES}
        if done
        else None,
        "tail_n": len(tail),
        "tail_mean_ms": {k: _round(statistics.fmean(s[k] for _, s in tail)) for k in STAGES}
        if tail
        else None,
        "tail_tiers": _count(str(x.get("tier")) for x, _ in tail),
    }
    if tail and batch:
        asks = [x["t_s"] + (x["engine"].get("asked_s") or 0.0) for x, _ in tail]
        out["tail_batch_slot_holders"] = sorted(_slot_holders(batch, t) for t in asks)
    worst = max(done, key=lambda r: r[0]["ttft_s"], default=None)
    if worst is not None:
        out["worst"] = {
            "tier": worst[0].get("tier"),
            **{k: _round(v) for k, v in worst[1].items()},
            "room_wait_ms": _round(1e3 * (worst[0]["engine"].get("room_wait_s") or 0.0)),
            "load_ms": _round(1e3 * (worst[0]["engine"].get("load_s") or 0.0)),
        }
    return out


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def run_view(server: Path, client: Path, duration_s: float) -> dict[str, Any]:
    lines, records = _lines(server), _lines(client)
    # The server log's clock against the client's: the first arrival on each.
    offset = min(x["t_s"] for x in lines) - min(r["t_s"] for r in records)
    sweep_s = HOT_BURST_WINDOW[0] * duration_s + offset
    hot = [x for x in lines if x["tenant"] == HOT_TENANT and x["t_s"] >= sweep_s]
    batch = [x for x in lines if x["tenant"] == HOT_BURST_SWEEP_TENANT]
    client_hot = [
        1e3 * r["ttft_s"]
        for r in records
        if r["tenant"] == HOT_TENANT and r["t_s"] >= HOT_BURST_WINDOW[0] * duration_s
        if r["ttft_s"] is not None
    ]
    client_batch = [
        1e3 * r["ttft_s"]
        for r in records
        if r["tenant"] == HOT_BURST_SWEEP_TENANT and r["ttft_s"] is not None
    ]
    return {
        "run": server.name.removesuffix(".requests.jsonl"),
        "client_hot_p99_ms": _round(_q(client_hot, 0.99)),
        "client_hot_p50_ms": _round(_q(client_hot, 0.5)),
        "client_batch_p50_ms": _round(_q(client_batch, 0.5)),
        "hot": tenant_view(hot, batch),
        "batch": tenant_view(batch, batch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs-dir", type=Path, required=True)
    parser.add_argument("--duration-s", type=float, required=True, help="the trace's length")
    args = parser.parse_args()
    for server in sorted(args.logs_dir.glob("*hot-burst*.requests.jsonl")):
        client = server.with_name(server.name.replace(".requests.jsonl", ".client.jsonl"))
        if not client.exists():
            continue  # a run still under way
        sys.stdout.write(json.dumps(run_view(server, client, args.duration_s)) + "\n")


if __name__ == "__main__":
    main()
