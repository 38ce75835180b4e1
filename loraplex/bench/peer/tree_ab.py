"""Two checkouts of loraplex through real servers, side by side (``scripts/serve-ab``).

Each lifetime starts ``loraplex serve`` as ``bench peer`` does (its loraplex settings, its demo
fleet, its client), with one checkout first on ``PYTHONPATH`` and as the working directory,
and sends: the first adapter answer, the greedy prompts (every lifetime's continuations are
compared), the unmeasured warm-up batch, then the adapter batch and the base batch alternately,
``batches`` times each. A lifetime's figure per batch kind is the median of its batches'
output tokens/s (completed requests only: a failed request lowers it and is counted), and of
the engine process's CPU milliseconds per output token over each batch (user + system, from
``/proc``: less sensitive to what else the machine runs than tokens/s, though not immune).
The checkouts take turns in ABBA order (``harness.order.run_order``).
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.bench.harness.order import run_order
from loraplex.bench.peer.client import BatchResult, Route, Shot, answers, first_answer, run_shots
from loraplex.bench.peer.loraplex_side import LoraplexServer
from loraplex.bench.peer.model import Workloads
from loraplex.bench.proc_tree import cpu_s, engine_child


@dataclass(frozen=True)
class TreeLifetime:
    """What one server lifetime of one checkout measured."""

    side: int  # index of the checkout in the comparison
    greedy: tuple[str | None, ...]  # the greedy continuations (None: that request failed)
    adapter: tuple[float, ...]  # output tokens/s of each adapter batch, in send order
    base: tuple[float, ...]  # output tokens/s of each base batch, in send order
    adapter_cpu: tuple[float, ...]  # engine CPU ms per output token of each adapter batch
    base_cpu: tuple[float, ...]  # engine CPU ms per output token of each base batch
    failures: int  # failed requests over the lifetime's measured batches and greedy prompts
    first_answer_s: float | None  # start to the first adapter answer; None: none came


def lifetime_order(num_lifetimes: int) -> list[int]:
    """The side of each lifetime in run order: 0 1 1 0 0 1 ... (``num_lifetimes`` per side)."""
    return [member for _, member in run_order([2], num_lifetimes)]


@dataclass(frozen=True)
class _Batch:
    result: BatchResult  # what the client saw
    engine_cpu_s: float  # the engine process's CPU seconds over the batch


async def _batch(url: str, routes: Sequence[Route], shots: Sequence[Shot], engine: int) -> _Batch:
    before = cpu_s(engine)
    result = await run_shots(url, routes, shots, 120.0)
    return _Batch(result, cpu_s(engine) - before)


def _cpu_ms_per_token(batch: _Batch) -> float:
    tokens = sum(r.completion_tokens for r in batch.result.records if r.ok)
    return batch.engine_cpu_s * 1e3 / tokens if tokens else math.inf


async def _exercise(
    url: str, routes: Sequence[Route], plan: Workloads, batches: int, *, started: float, engine: int
) -> tuple[float | None, list[str | None], list[_Batch], list[_Batch]]:
    _, prompt, max_tokens = plan.probes[0]
    ok = await first_answer(url, routes[0], prompt, max_tokens, started + 600.0)
    first = time.monotonic() - started if ok else None
    greedy = await answers(url, routes, plan.greedy, 120.0)
    await run_shots(url, routes, plan.warmup, 120.0)
    adapter, base = [], []
    for _ in range(batches):
        adapter.append(await _batch(url, routes, plan.adapter_batch, engine))
        base.append(await _batch(url, routes, plan.base_batch, engine))
    return first, greedy, adapter, base


def run_tree_lifetime(
    server: LoraplexServer,
    plan: Workloads,
    *,
    side: int,
    python_path: str,
    data_dir: Path,
    batches: int,
) -> TreeLifetime:
    """One lifetime of ``server`` with ``python_path`` as the server's ``PYTHONPATH`` (its first
    entry, the checkout, also its working directory)."""
    os.environ["PYTHONPATH"] = python_path  # the server process inherits os.environ
    os.chdir(python_path.split(os.pathsep, maxsplit=1)[0])  # ``python -c``: first on sys.path
    routes = (*server.routes(), server.base_route())
    started = time.monotonic()
    with server.serving_process(data_dir) as served:
        engine = engine_child(served.pid)
        work = _exercise(served.url, routes, plan, batches, started=started, engine=engine)
        first, greedy, adapter, base = asyncio.run(work)
    failed = sum(len(b.result.records) - b.result.completed for b in (*adapter, *base))
    return TreeLifetime(
        side,
        tuple(greedy),
        adapter=tuple(b.result.tokens_per_s for b in adapter),
        base=tuple(b.result.tokens_per_s for b in base),
        adapter_cpu=tuple(_cpu_ms_per_token(b) for b in adapter),
        base_cpu=tuple(_cpu_ms_per_token(b) for b in base),
        failures=failed + sum(g is None for g in greedy),
        first_answer_s=first,
    )


def spread(values: Sequence[float], digits: int | None = None) -> dict[str, Any]:
    """Median, min, max and every value (rounded to ``digits``; None: whole numbers), in the
    given order; a value that is not finite (a batch with no token) is null."""

    def rounded(value: float) -> float | None:
        return round(value, digits) if math.isfinite(value) else None

    return {
        "median": rounded(statistics.median(values)),
        "min": rounded(min(values)),
        "max": rounded(max(values)),
        "all": [rounded(v) for v in values],
    }


def ab_result(lifetimes: Sequence[TreeLifetime], labels: Sequence[str]) -> dict[str, Any]:
    """The comparison's JSON: per side the lifetimes' figures (each the median of its batches),
    the second side over the first on the medians (null when the first is 0), and whether every
    lifetime gave the same greedy continuations with none failed."""
    out: dict[str, Any] = {"order": [labels[lt.side] for lt in lifetimes]}
    medians: dict[str, list[float]] = {}
    for side, label in enumerate(labels):
        mine = [lt for lt in lifetimes if lt.side == side]
        record: dict[str, Any] = {"lifetimes": len(mine)}
        for kind in ("base", "adapter"):
            figures = [statistics.median(getattr(lt, kind)) for lt in mine]
            record[kind] = spread(figures)
            medians.setdefault(kind, []).append(statistics.median(figures))
            cpu = [statistics.median(getattr(lt, f"{kind}_cpu")) for lt in mine]
            record[f"{kind}_engine_cpu_ms_per_token"] = spread(cpu, 4)
            medians.setdefault(f"{kind}_engine_cpu_ms_per_token", []).append(statistics.median(cpu))
        record["failures"] = sum(lt.failures for lt in mine)
        record["first_answer_s"] = [
            None if lt.first_answer_s is None else round(lt.first_answer_s, 2) for lt in mine
        ]
        out[label] = record
    for kind, (first, second) in medians.items():
        ratio = (
            None if first == 0 or not math.isfinite(first + second) else round(second / first, 3)
        )
        out[f"{labels[1]}_over_{labels[0]}_{kind}"] = ratio
    greedy = {lt.greedy for lt in lifetimes}
    out["greedy_identical"] = len(greedy) == 1 and None not in next(iter(greedy))
    return out
