"""``loraplex bench peer``: loraplex and vLLM's CPU build side by side, one server at a time, on
the same demo model and 16 adapters, with matched settings and the same client.

For each ``max_loras`` setting the two servers take turns (ABBA: loraplex, vLLM, vLLM, loraplex,
and so on for ``rounds``), never both alive at once. Every server run (a "lifetime") does, in
this order: start to the first adapter answer; the 16 adapter probes; greedy continuations of
random prompts; an unmeasured warm-up batch; the adapter batch (``requests`` at once over the 16
adapters); the same prompts on the base model; and, once both sides' capacity is known (from
the third lifetime on), the zipf trace at a rate common to both (``load`` times the slower
side's capacity). Peak memory of the server's process tree is sampled throughout.

The other server is a ``PeerServer``: vLLM (``peer_vllm.VllmServer``) in the benchmark, a
stand-in in the tests. Summaries and ratios are in ``peer_report``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from loraplex.bench.harness.order import run_order
from loraplex.bench.harness.process import fresh_run_dir
from loraplex.bench.peer.client import (
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
from loraplex.bench.peer.report import peer_result
from loraplex.bench.peer.vllm import PeerSettings
from loraplex.bench.serve.driver import prompt_ids
from loraplex.demo.manifest import DemoAssets


class PeerServer(Protocol):
    """One side of the comparison: a server it can start, and its names for the models."""

    label: str  # "loraplex" or "vllm": the side's name in the results

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        """Starts the server; yields its base URL once it answers health checks; stops it."""
        ...

    def routes(self) -> tuple[Route, ...]:
        """The server's route to each demo adapter, in manifest order."""
        ...

    def base_route(self) -> Route:
        """The server's route to the base model."""
        ...


def shot_shape(config: PeerBenchConfig, vocab: int) -> ShotShape:
    return ShotShape(config.prompt_tokens, config.output_tokens, vocab)


def workloads(assets: DemoAssets, vocab: int, config: PeerBenchConfig) -> Workloads:
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
    base = tuple(Shot(s.t_s, n, s.prompt, s.output_tokens) for s in adapter)
    warmup = batch_shots(config.requests, n, shape, f"warmup-{config.seed}")
    expected = tuple(a.expected_continuation for a in assets.adapters)
    return Workloads(probes, expected, greedy, warmup, adapter, base)


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


def run_lifetime(
    server: PeerServer,
    plan: Workloads,
    data_dir: Path,
    config: PeerBenchConfig,
    trace: Sequence[Shot] | None,
) -> Lifetime:
    """Starts ``server``, runs every workload against it, stops it; its memory peak beside."""
    with RssSampler() as rss:
        started = time.monotonic()  # just before the server's process starts
        with server.serving(data_dir) as url:
            lifetime = asyncio.run(
                _exercise(url, server, plan, config, started=started, trace=trace)
            )
    return replace(lifetime, peak_rss_bytes=rss.peak_bytes)


def common_rate(lifetimes: Sequence[Lifetime], labels: Sequence[str], load: float) -> float | None:
    """``load`` times the slower side's capacity (completed adapter-batch requests per second
    in its first lifetime); None while a side has none, or when one completed nothing."""
    firsts = [next((lt for lt in lifetimes if lt.label == label), None) for label in labels]
    if any(lt is None for lt in firsts):
        return None
    capacity = min(lt.adapter.completed_per_s for lt in firsts if lt is not None)
    return load * capacity if capacity > 0 else None


def run_setting(
    pair: tuple[PeerServer, PeerServer],
    settings: PeerSettings,
    plan: Workloads,
    config: PeerBenchConfig,
    *,
    vocab: int,
    root: Path,
) -> SettingRuns:
    """Every lifetime of one setting in ABBA order; the trace from the third lifetime on."""
    labels = [server.label for server in pair]
    if labels[0] == labels[1]:
        raise ValueError(f"labels {labels} are invalid; expected two different sides")
    lifetimes: list[Lifetime] = []
    rate: float | None = None
    trace: tuple[Shot, ...] | None = None
    for index, (_, member) in enumerate(run_order([2], config.rounds)):
        if trace is None and index >= 2:
            rate = common_rate(lifetimes, labels, config.load)
            if rate is not None:
                shape, n = shot_shape(config, vocab), len(plan.probes)
                trace = zipf_trace(rate, config.trace_requests, n, shape, config.seed)
        data_dir = root / f"max-loras-{settings.max_loras}" / f"run-{index}-{labels[member]}"
        lifetimes.append(run_lifetime(pair[member], plan, data_dir, config, trace))
    return SettingRuns(settings, (labels[0], labels[1]), tuple(lifetimes), rate, plan.expected)


def run_peer_bench(
    config: PeerBenchConfig,
    assets: DemoAssets,
    make_pair: Callable[[PeerSettings, Path], tuple[PeerServer, PeerServer]],
    root: Path,
) -> list[SettingRuns]:
    """Every setting of ``config``; ``make_pair`` builds (loraplex, other) for one setting
    (given a directory it may prepare files in). Every server's data directory and log stay
    under ``root``."""
    from loraplex.artifacts.base_model import BaseModelSpec

    vocab = BaseModelSpec.from_dir(assets.base_model_dir).vocab_size
    plan = workloads(assets, vocab, config)
    results = []
    for max_loras in config.max_loras:
        settings = matched_settings(
            assets, max_loras, threads=config.threads, vllm_cpu_bind=config.vllm_cpu_bind
        )
        pair = make_pair(settings, root)
        results.append(run_setting(pair, settings, plan, config, vocab=vocab, root=root))
    return results


def run_against_vllm(config: PeerBenchConfig, python: Path, version: str) -> dict[str, Any]:
    """The whole benchmark: loraplex against vLLM ``version`` run by ``python``."""
    from loraplex.bench.peer.loraplex_side import LoraplexServer, prepare_demo_fleet
    from loraplex.bench.peer.vllm import VllmServer
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)

    def make_pair(settings: PeerSettings, root: Path) -> tuple[PeerServer, PeerServer]:
        fleet_root = root / f"fleet-{settings.max_loras}"
        fleet = prepare_demo_fleet(fleet_root, assets, settings.max_lora_rank)
        ours = LoraplexServer(
            fleet,
            assets,
            settings,
            queue_deadline_s=config.request_timeout_s,
            start_timeout_s=config.start_timeout_s,
        )
        theirs = VllmServer(python, assets, settings, start_timeout_s=config.start_timeout_s)
        return ours, theirs

    root = fresh_run_dir(config.logs_dir, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    runs = run_peer_bench(config, assets, make_pair, root)
    result = peer_result(config, runs, f"vllm {version} ({python})")
    result["logs_dir"] = str(root)
    return result
