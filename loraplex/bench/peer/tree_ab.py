"""Two checkouts of loraplex through real servers, side by side (``scripts/serve-ab``).

Each lifetime starts ``loraplex serve`` as ``bench peer`` does (its loraplex settings, its demo
fleet, its client), with one checkout first on ``PYTHONPATH`` and as the working directory,
and sends: the first adapter answer, the greedy prompts (every lifetime's continuations are
compared), the unmeasured warm-up batch, then the adapter batch and the base batch alternately,
``batches`` times each. A lifetime's figure per batch kind is the median of its batches'
output tokens/s (completed requests only: a failed request lowers it and is counted). The
checkouts take turns in ABBA order (``harness.order.run_order``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.bench.harness.order import run_order
from loraplex.bench.peer.client import BatchResult, Route, answers, first_answer, run_shots
from loraplex.bench.peer.loraplex_side import LoraplexServer
from loraplex.bench.peer.model import Workloads


@dataclass(frozen=True)
class TreeLifetime:
    """What one server lifetime of one checkout measured."""

    side: int  # index of the checkout in the comparison
    greedy: tuple[str | None, ...]  # the greedy continuations (None: that request failed)
    adapter: tuple[float, ...]  # output tokens/s of each adapter batch, in send order
    base: tuple[float, ...]  # output tokens/s of each base batch, in send order
    failures: int  # failed requests over the lifetime's measured batches and greedy prompts
    first_answer_s: float | None  # start to the first adapter answer; None: none came


def lifetime_order(num_lifetimes: int) -> list[int]:
    """The side of each lifetime in run order: 0 1 1 0 0 1 ... (``num_lifetimes`` per side)."""
    return [member for _, member in run_order([2], num_lifetimes)]


async def _exercise(
    url: str, routes: Sequence[Route], plan: Workloads, batches: int, started: float
) -> tuple[float | None, list[str | None], list[BatchResult], list[BatchResult]]:
    _, prompt, max_tokens = plan.probes[0]
    ok = await first_answer(url, routes[0], prompt, max_tokens, started + 600.0)
    first = time.monotonic() - started if ok else None
    greedy = await answers(url, routes, plan.greedy, 120.0)
    await run_shots(url, routes, plan.warmup, 120.0)
    adapter, base = [], []
    for _ in range(batches):
        adapter.append(await run_shots(url, routes, plan.adapter_batch, 120.0))
        base.append(await run_shots(url, routes, plan.base_batch, 120.0))
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
    with server.serving(data_dir) as url:
        first, greedy, adapter, base = asyncio.run(_exercise(url, routes, plan, batches, started))
    failed = sum(len(b.records) - b.completed for b in (*adapter, *base))
    return TreeLifetime(
        side,
        tuple(greedy),
        tuple(b.tokens_per_s for b in adapter),
        tuple(b.tokens_per_s for b in base),
        failed + sum(g is None for g in greedy),
        first,
    )


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and every value (rounded to whole tokens/s), in the given order."""
    return {
        "median": round(statistics.median(values)),
        "min": round(min(values)),
        "max": round(max(values)),
        "all": [round(v) for v in values],
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
        record["failures"] = sum(lt.failures for lt in mine)
        record["first_answer_s"] = [
            None if lt.first_answer_s is None else round(lt.first_answer_s, 2) for lt in mine
        ]
        out[label] = record
    for kind, (first, second) in medians.items():
        ratio = None if first == 0 else round(second / first, 3)
        out[f"{labels[1]}_over_{labels[0]}_{kind}"] = ratio
    greedy = {lt.greedy for lt in lifetimes}
    out["greedy_identical"] = len(greedy) == 1 and None not in next(iter(greedy))
    return out
