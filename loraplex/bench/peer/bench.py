"""``loraplex bench peer``: loraplex and vLLM's CPU build side by side, one server at a time, on
the same demo model and 16 adapters, with matched settings and the same client.

Three kinds of server run per ``max_loras`` setting: loraplex (L), vLLM with LoRA enabled (V)
and vLLM without LoRA (N, the base model at vLLM's best), in ABBA order over the kinds
(L V N, N V L, ...) for ``rounds`` rounds, never two alive at once. Every L and V server run
(a "lifetime") does, in this order: start to the first adapter answer; the 16 adapter probes;
greedy continuations of random prompts; an unmeasured warm-up batch; the adapter batch
(``requests`` at once over the 16 adapters); the same prompts on the base model; and, once both
L's and V's capacity is known, the zipf trace at a rate common to both (``load`` times the
slower one's capacity). An N lifetime does only what it can: start to the first base answer,
the same warm-up batch on the base model, the base batch. Peak memory of the server's process
tree is sampled throughout.

The other servers are ``PeerServer``s: vLLM (``peer.vllm.VllmServer``) in the benchmark,
stand-ins in the tests. Summaries and ratios are in ``peer.report``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from loraplex.bench.harness.order import run_order
from loraplex.bench.peer.assets import PeerAssets
from loraplex.bench.peer.client import (
    BatchResult,
    Route,
    Shot,
    ShotShape,
    answers,
    batch_shots,
    first_answer,
    run_shots,
    zipf_trace,
)
from loraplex.bench.peer.loraplex_side import matched_settings
from loraplex.bench.peer.memory import RssSampler
from loraplex.bench.peer.model import Lifetime, PeerBenchConfig, SettingRuns, Workloads
from loraplex.bench.peer.vllm import PeerSettings
from loraplex.bench.serve.driver import prompt_ids


class PeerServer(Protocol):
    """One kind of server in the comparison: one it can start, and its names for the models."""

    label: str  # the kind's name in the results: "loraplex", "vllm", "vllm-nolora"
    serves_adapters: bool  # False: the base model only (the adapter workloads are skipped)

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        """Starts the server; yields its base URL once it answers health checks; stops it."""
        ...

    def routes(self) -> tuple[Route, ...]:
        """The server's route to each adapter, in route order (none without adapters)."""
        ...

    def base_route(self) -> Route:
        """The server's route to the base model."""
        ...


def shot_shape(config: PeerBenchConfig, vocab: int) -> ShotShape:
    return ShotShape(config.prompt_tokens, config.output_tokens, vocab)


def workloads(assets: PeerAssets, vocab: int, config: PeerBenchConfig) -> Workloads:
    """The probes, greedy prompts and batches of every lifetime (seeded by ``config.seed``)."""
    n = len(assets.adapters)
    probes = tuple((i, a.probe_prompt, a.probe_max_tokens) for i, a in enumerate(assets.adapters))
    rng = random.Random(f"greedy-{config.seed}")
    greedy = tuple(  # route n is the base model: it is compared too
        (i % (n + 1), tuple(prompt_ids(rng, config.prompt_tokens, vocab)), config.greedy_tokens)
        for i in range(config.greedy_prompts)
    )
    shape = shot_shape(config, vocab)
    adapter = batch_shots(config.requests, n, shape, f"batch-{config.seed}")
    base = on_base(adapter, n)
    warmup = batch_shots(config.requests, n, shape, f"warmup-{config.seed}")
    expected = tuple(a.expected_continuation for a in assets.adapters)
    return Workloads(probes, expected, greedy, warmup, adapter, base)


def on_base(shots: Sequence[Shot], base_route: int) -> tuple[Shot, ...]:
    """The same requests, every one on the base model's route."""
    return tuple(Shot(s.t_s, base_route, s.prompt, s.output_tokens) for s in shots)


async def _exercise(
    url: str,
    server: PeerServer,
    plan: Workloads,
    config: PeerBenchConfig,
    *,
    started: float,
    trace: Sequence[Shot] | None,
) -> Lifetime:
    routes = (*server.routes(), server.base_route())
    timeout = config.request_timeout_s
    _, prompt, max_tokens = plan.probes[0]
    deadline = started + config.start_timeout_s
    ok = await first_answer(url, routes[0], prompt, max_tokens, deadline)
    first = time.monotonic() - started if ok else None
    probes = await answers(url, routes, plan.probes, timeout)
    greedy = await answers(url, routes, plan.greedy, timeout)
    await run_shots(url, routes, plan.warmup, timeout)
    adapter = await run_shots(url, routes, plan.adapter_batch, timeout)
    base = await run_shots(url, routes, plan.base_batch, timeout)
    traced = None if trace is None else await run_shots(url, routes, trace, timeout)
    return Lifetime(server.label, first, tuple(probes), tuple(greedy), adapter, base, traced)


async def _exercise_base(
    url: str, server: PeerServer, plan: Workloads, config: PeerBenchConfig, *, started: float
) -> Lifetime:
    """A server without adapters: first base answer, the warm-up on the base, the base batch."""
    n = len(plan.probes)
    routes = tuple(server.base_route() for _ in range(n + 1))  # every route index: the base
    _, prompt, max_tokens = plan.probes[0]
    deadline = started + config.start_timeout_s
    ok = await first_answer(url, routes[n], prompt, max_tokens, deadline)
    first = time.monotonic() - started if ok else None
    await run_shots(url, routes, on_base(plan.warmup, n), config.request_timeout_s)
    base = await run_shots(url, routes, plan.base_batch, config.request_timeout_s)
    return Lifetime(server.label, first, (), (), None, base, None)


def run_lifetime(
    server: PeerServer,
    plan: Workloads,
    data_dir: Path,
    config: PeerBenchConfig,
    trace: Sequence[Shot] | None,
) -> Lifetime:
    """Starts ``server``, runs its workloads against it, stops it; its memory peak beside."""
    with RssSampler() as rss:
        started = time.monotonic()  # just before the server's process starts
        with server.serving(data_dir) as url:
            if server.serves_adapters:
                work = _exercise(url, server, plan, config, started=started, trace=trace)
            else:
                work = _exercise_base(url, server, plan, config, started=started)
            lifetime = asyncio.run(work)
    return replace(lifetime, peak_rss_bytes=rss.peak_bytes)


def common_rate(lifetimes: Sequence[Lifetime], labels: Sequence[str], load: float) -> float | None:
    """``load`` times the slower kind's capacity (completed adapter-batch requests per second
    in its first lifetime) over the kinds ``labels``; None while one has none, or when one
    completed nothing."""
    batches: list[BatchResult] = []
    for label in labels:
        first = next((lt for lt in lifetimes if lt.label == label), None)
        if first is None or first.adapter is None:
            return None
        batches.append(first.adapter)
    capacity = min(batch.completed_per_s for batch in batches)
    return load * capacity if capacity > 0 else None


def run_setting(
    servers: Sequence[PeerServer],
    settings: PeerSettings,
    plan: Workloads,
    config: PeerBenchConfig,
    *,
    vocab: int,
    root: Path,
) -> SettingRuns:
    """Every lifetime of one setting in ABBA order over the kinds (loraplex first, then the
    other server, then, if given, the other server without adapters); the trace once the
    first two kinds' capacities are known."""
    labels = [server.label for server in servers]
    if len(set(labels)) != len(labels) or not 2 <= len(labels) <= 3:
        raise ValueError(f"labels {labels} are invalid; expected two or three different kinds")
    if not all(server.serves_adapters for server in servers[:2]):
        raise ValueError("servers are invalid; expected the first two to serve adapters")
    lifetimes: list[Lifetime] = []
    rate: float | None = None
    trace: tuple[Shot, ...] | None = None
    for index, (_, member) in enumerate(run_order([len(servers)], config.rounds)):
        if trace is None:
            rate = common_rate(lifetimes, labels[:2], config.load)
            if rate is not None:
                shape, n = shot_shape(config, vocab), len(plan.probes)
                trace = zipf_trace(rate, config.trace_requests, n, shape, config.seed)
        data_dir = root / f"max-loras-{settings.max_loras}" / f"run-{index}-{labels[member]}"
        lifetimes.append(run_lifetime(servers[member], plan, data_dir, config, trace))
    return SettingRuns(settings, tuple(labels), tuple(lifetimes), rate, plan.expected)


def run_peer_bench(
    config: PeerBenchConfig,
    assets: PeerAssets,
    make_servers: Callable[[PeerSettings, Path], Sequence[PeerServer]],
    root: Path,
) -> list[SettingRuns]:
    """Every setting of ``config``; ``make_servers`` builds (loraplex, other[, other without
    adapters]) for one setting (given a directory it may prepare files in). Every server's
    data directory and log stay under ``root``."""
    from loraplex.artifacts.base_model import BaseModelSpec

    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    plan = workloads(assets, vocab, config)
    results = []
    for max_loras in config.max_loras:
        settings = matched_settings(
            assets, max_loras, threads=config.threads, vllm_cpu_bind=config.vllm_cpu_bind
        )
        servers = make_servers(settings, root)
        results.append(run_setting(servers, settings, plan, config, vocab=vocab, root=root))
    return results
