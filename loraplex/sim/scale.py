"""``scale_run``: how long the simulator takes for N requests over A adapters and R replicas.

The trace is synthetic and deterministic (``synthetic_trace``): zipf(1.0) popularity over the
adapters (spread over ``max(1, A // 100)`` tenants, ranks 64/32/16/8 round robin), Poisson
arrivals at ``rate_per_replica * R`` requests per second, 64 prompt and 16 output tokens (the
short fixed lengths WORKLOADS.md uses for cache studies). The run is a plain ``simulate``: the
real scheduler at every step, the real caches and the real router at every request.

Reported: wall seconds of the simulation alone (trace generation apart) and the CPU seconds
the process spent in it (on a shared machine the wall seconds grow with the load, the CPU
seconds much less), the process's peak
RSS (``ru_maxrss``: the whole process's peak so far, so a run after others reports at least
theirs), simulated seconds, engine steps, and the run's headline figures.
"""

from __future__ import annotations

import itertools
import random
import resource
import sys
import time
from typing import Any

from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

RANKS = (64, 32, 16, 8)  # WORKLOADS.md "S2", round robin by popularity
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 16


def synthetic_trace(
    num_requests: int, num_adapters: int, rate: float, seed: int = 0
) -> list[TraceRecord]:
    """``num_requests`` Poisson arrivals at ``rate``/s, adapters drawn zipf(1.0)."""
    if min(num_requests, num_adapters) < 1 or not rate > 0:
        raise ValueError(
            f"num_requests {num_requests} / num_adapters {num_adapters} / rate {rate} is "
            "invalid; expected >= 1 / >= 1 / > 0"
        )
    rng = random.Random(seed)
    num_tenants = max(1, num_adapters // 100)
    names = [(f"tenant-{i % num_tenants:03d}", f"adapter-{i:05d}") for i in range(num_adapters)]
    cumulative = list(itertools.accumulate(1.0 / (i + 1) for i in range(num_adapters)))
    picks = rng.choices(range(num_adapters), cum_weights=cumulative, k=num_requests)
    t_s = 0.0
    records = []
    for pick in picks:
        t_s += rng.expovariate(rate)
        tenant, adapter = names[pick]
        records.append(
            TraceRecord(
                t_s, tenant, adapter, PROMPT_TOKENS, OUTPUT_TOKENS, rank=RANKS[pick % len(RANKS)]
            )
        )
    return records


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def scale_run(
    requests: int,
    adapters: int,
    replicas: int,
    cost_model: CostModel,
    *,
    rate_per_replica: float = 20.0,
    seed: int = 0,
) -> dict[str, Any]:
    """One timed simulation of the synthetic trace (module docstring); a JSON-able dict."""
    trace = synthetic_trace(requests, adapters, rate_per_replica * replicas, seed)
    config = SimConfig(replicas=replicas, seed=seed)
    start, start_cpu = time.perf_counter(), time.process_time()
    result = simulate(trace, config, cost_model)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    m = result.metrics
    key = f"sim_seconds_{_short(requests)}_requests_{_short(adapters)}_adapters_{replicas}_replicas"
    return {
        key: round(wall_s, 3),
        "requests": requests,
        "adapters": adapters,
        "replicas": replicas,
        "rate_per_s": rate_per_replica * replicas,
        "sim_wall_s": round(wall_s, 3),
        "sim_cpu_s": round(cpu_s, 3),  # this process's CPU seconds: less sensitive to load
        "requests_per_wall_s": round(requests / wall_s, 1) if wall_s > 0 else None,
        "peak_rss_bytes": peak_rss_bytes(),
        "simulated_s": m["makespan_s"],
        "engine_steps": m["engine_steps"],
        "completed_ratio": m["completed_ratio"],
        "l0_hit_ratio": m["l0_hit_ratio"],
        "ttft_ms": m["ttft_ms"],
        "decisions": m.get("decisions", {}),
        "hardware": cost_model.hardware,
    }


def _short(n: int) -> str:
    """1000000 -> "1m", 10000 -> "10k" (the headline key's spelling), else the number."""
    for unit, suffix in ((1_000_000, "m"), (1000, "k")):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)
