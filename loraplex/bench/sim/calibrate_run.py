"""``loraplex sim calibrate``'s measurements of a server (``calibrate_target``), fitted by
``sim/calibrate.py`` into a validated cost-model file (``calibration.measure`` runs them in
order, with the cold requests of ``calibrate_cold``).

- Decode steps: controlled mixes sent at once (``batch`` requests over ``revisions`` distinct
  adapters, the lowest or the highest ranks of each target set, and with two target sets both
  sets' lowest ranks together), every adapter in a GPU slot first; each request
  decodes ``output_tokens`` tokens with ``ignore_eos``, so while they run each engine step holds
  ``batch`` decode tokens, and the median time per output token (TPOT) is the step time of that
  mix.
- Prefill steps: lone warm requests (one at a time, so nothing queues) with prompts of each of
  ``prefill_lengths`` tokens, on each target set's lowest- and highest-rank adapter, sent as
  ``bench sim``'s real runs send a trace's requests (``bench/serve/driver.replay_over_http``:
  arrivals ``hop_gap_s`` apart, so each finds the server idle, and ``hop_output_tokens`` tokens
  each, so the first token streams back while the engine decodes the next):
  the median TTFT less ``front_s`` is one prefill step plus the front-to-engine hop, fitted
  together with the decode samples (``sim/calibrate.py``); ``ipc_s`` is the median over those
  requests of what each leaves beyond the fitted step (``sim/calibrate.median_hop_s``). (Sent
  back to back with ``max_tokens`` 1, as before 2026-12-04, lone requests were 6-9 ms faster
  than the same requests in a trace: docs/simulator.md, "SIMVAL".)
- Tier links: cold loads of adapters of known bytes, one tier at a time through the admin API
  (``/admin/residency/prefetch`` with ``wait``), timed by the server's own stage counters
  (``stats.stages`` of ``/admin/residency``): resolve + fetch + verify + commit for L3 -> L2,
  read for L2 -> L1, copy for L1 -> L0; bytes are the copy's ``size_bytes`` in L2 and L1.
- Overheads: ``front_s`` is the median latency of an authenticated ``GET /v1/models`` (HTTP,
  auth, no engine); ``ipc_s`` is fitted with the step (above); ``network_s`` is not measured on
  one server (0, said so).
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from loraplex.bench.serve.driver import DriveConfig, prompt_ids, replay_over_http, send_one
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
from loraplex.bench.workloads import TraceRequest
from loraplex.sim.calibrate import LoadSample, StepSample

L3_STAGES = ("resolve", "fetch", "verify", "commit")
LINK_STAGES = {"L3_to_L2": L3_STAGES, "L2_to_L1": ("read",), "L1_to_L0": ("copy",)}
LINK_TIERS = {"L3_to_L2": "L2", "L2_to_L1": "L1", "L1_to_L0": "L0"}
LINK_SIZE_TIER = {"L3_to_L2": "L2", "L2_to_L1": "L1", "L1_to_L0": "L1"}
# How the lone warm requests of both calibrations (this one and ``calibrate_fleet``) are paced.
HOP_GAP_S = 0.25  # idle seconds before each
HOP_OUTPUT_TOKENS = 8  # tokens each generates


def check_pacing(gap_s: float, output_tokens: int) -> None:
    """Refuses a pacing by the config field it came from (``hop_gap_s``, ``hop_output_tokens``)."""
    if not (gap_s >= 0 and math.isfinite(gap_s)):
        raise ValueError(f"hop_gap_s {gap_s!r} is invalid; expected finite >= 0")
    if output_tokens < 1:
        raise ValueError(f"hop_output_tokens {output_tokens} is invalid; expected >= 1")


def paced_requests(
    tenant: str, adapter: str, prompt_tokens: int, *, count: int, gap_s: float, output_tokens: int
) -> list[TraceRequest]:
    """``count`` lone requests as a trace ``bench sim``'s real runs would send: ``gap_s`` apart
    from the first (one at a time, each after the server idled; no queueing in the figure),
    ``output_tokens`` each (the first token streams back while the engine decodes the next).
    Back to back with ``max_tokens`` 1 a lone request was 6-9 ms faster than in a trace
    (docs/simulator.md, "SIMVAL"); both calibrations send their lone requests this way."""
    return [
        TraceRequest(gap_s * (i + 1), tenant, adapter, prompt_tokens, output_tokens)
        for i in range(count)
    ]


@dataclass(frozen=True)
class CalibrateConfig:
    """What one calibration measures."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)  # decode tokens per step in the mixes
    revision_counts: tuple[int, ...] = (1, 2, 4)  # distinct adapters per mix (<= batch)
    prompt_tokens: int = 8  # prompt of every decode-mix request
    prefill_lengths: tuple[int, ...] = (8, 16, 32, 64)  # prompts of the lone prefill requests
    output_tokens: int = 24  # decode steps of every mix request
    repeats: int = 3  # runs of each mix (one sample: the median of the runs' median TPOTs)
    overhead_requests: int = 8  # front_s requests; lone requests per prefill length and rank
    hop_gap_s: float = HOP_GAP_S  # idle seconds before each lone warm (prefill) request
    hop_output_tokens: int = HOP_OUTPUT_TOKENS  # tokens each lone warm (prefill) request makes
    request_timeout_s: float = 60.0  # bound on every request
    seed: int = 0  # prompt contents

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "revision_counts", "prefill_lengths"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"{name} {values!r} is invalid; expected counts >= 1")
        for name in ("prompt_tokens", "repeats", "overhead_requests", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)!r} is invalid; expected > 0")
        check_pacing(self.hop_gap_s, self.hop_output_tokens)
        if self.output_tokens < 3:
            raise ValueError(f"output_tokens {self.output_tokens} is invalid; expected >= 3")


def drive_config(target: Target, config: CalibrateConfig) -> DriveConfig:
    return DriveConfig(
        request_timeout_s=config.request_timeout_s,
        vocab_size=target.vocab_size,
        seed=config.seed,
    )


def prefetch(client: httpx.Client, adapter: ServedAdapter, tier: str) -> None:
    """Loads ``adapter`` into ``tier`` and waits for it."""
    body = {"model": adapter.ref, "tier": tier, "wait": True}
    reply = client.post("/admin/residency/prefetch", json=body)
    reply.raise_for_status()


def stage_totals(client: httpx.Client) -> dict[str, float]:
    reply = client.get("/admin/residency", params={"top": 0})
    reply.raise_for_status()
    stages = reply.json()["stats"]["stages"]
    return {str(k): float(v["total_s"]) for k, v in stages.items()}


def copy_sizes(client: httpx.Client, adapter: ServedAdapter) -> dict[str, int]:
    """tier -> size_bytes of ``adapter``'s copies."""
    reply = client.get("/admin/residency")
    reply.raise_for_status()
    return {
        str(e["tier"]): int(e["size_bytes"])
        for e in reply.json()["entries"]
        if e["model"] == adapter.ref
    }


def evict_everywhere(client: httpx.Client, adapter: ServedAdapter) -> None:
    """Drops the adapter's copies (L0, then L1, then L2); a copy that is absent, pinned or in
    use stays (the load that follows then measures less, which the fit's residuals show)."""
    for tier in ("L0", "L1", "L2"):
        client.post("/admin/residency/evict", json={"model": adapter.ref, "tier": tier})


def into_slots(
    client: httpx.Client, adapters: Sequence[ServedAdapter], wanted: Sequence[ServedAdapter]
) -> None:
    """Prefetches ``wanted`` into L0 after dropping every other adapter's L0 copy.
    NOTE: a server holds one tenant to ``default_tenant_tier_share`` of the slots (half by
    default) and refuses a prefetch its eviction policy finds not worth its victims (503), so
    the calibration frees the slots itself rather than asking the policy to evict."""
    for adapter in adapters:
        if adapter not in wanted:
            client.post("/admin/residency/evict", json={"model": adapter.ref, "tier": "L0"})
    for adapter in wanted:
        prefetch(client, adapter, "L0")


def with_sizes(client: httpx.Client, target: Target) -> Target:
    """``target`` with every adapter's ``size_bytes`` known: a remote server's are read from
    its L1 copy (loaded for the purpose), the bytes a trace's ``size_bytes`` carries."""
    adapters = []
    for adapter in target.adapters:
        sized = adapter
        if adapter.size_bytes <= 0:
            prefetch(client, adapter, "L1")
            sized = replace(adapter, size_bytes=copy_sizes(client, adapter).get("L1", 0))
        adapters.append(sized)
    return replace(target, adapters=tuple(adapters))


def load_samples(
    client: httpx.Client, adapters: Sequence[ServedAdapter], store: Path | None = None
) -> list[LoadSample]:
    """One cold load per adapter, tier by tier, timed by the server's stage counters; each
    adapter is dropped again after its loads, so every load lands in free space (no eviction
    in the figure, no tier share in the way). With ``store`` (the server's artifact store on
    this machine) its cached pages are dropped first, so L3 reads come from disk."""
    from loraplex.bench.serve.fleet import drop_page_cache

    samples: list[LoadSample] = []
    for adapter in adapters:
        evict_everywhere(client, adapter)
        if store is not None:
            drop_page_cache(store)
        for link, tier in LINK_TIERS.items():
            before = stage_totals(client)
            prefetch(client, adapter, tier)
            after = stage_totals(client)
            seconds = sum(after.get(s, 0.0) - before.get(s, 0.0) for s in LINK_STAGES[link])
            nbytes = copy_sizes(client, adapter).get(LINK_SIZE_TIER[link], 0)
            if nbytes > 0 and seconds > 0:
                samples.append(LoadSample(link, nbytes, seconds))
        evict_everywhere(client, adapter)
    return samples


def target_sets(adapters: Sequence[ServedAdapter]) -> list[list[ServedAdapter]]:
    """The adapters grouped by bytes per rank (one group per target set; one group when no
    size is known), each group by rank, the narrowest group first."""
    groups: dict[float, list[ServedAdapter]] = {}
    for adapter in adapters:
        groups.setdefault(adapter.size_bytes / adapter.rank, []).append(adapter)
    return [
        sorted(groups[width], key=lambda a: (a.rank, a.tenant, a.name)) for width in sorted(groups)
    ]


def slots_for_mixes(config: CalibrateConfig, tenant_tier_share: float) -> int:
    """The fewest GPU slots at which one tenant's share of them (``default_tenant_tier_share``)
    holds the largest mix's distinct adapters: below it ``into_slots`` is refused (503)."""
    return math.ceil(max(config.revision_counts) / tenant_tier_share)


def mixes(
    adapters: Sequence[ServedAdapter], config: CalibrateConfig
) -> list[tuple[int, tuple[ServedAdapter, ...]]]:
    """(batch, adapters) per mix: every batch size x revision count that fits, with the
    lowest-rank and the highest-rank adapters of each target set (rank-tokens and bytes vary
    apart from revisions), and with two target sets the lowest ranks of both in one step."""
    groups = target_sets(adapters)
    out = []
    for batch in config.batch_sizes:
        for revisions in config.revision_counts:
            for by_rank in groups:
                if revisions > batch or revisions > len(by_rank):
                    continue
                low, high = tuple(by_rank[:revisions]), tuple(by_rank[-revisions:])
                out += [(batch, low)] + ([(batch, high)] if high != low else [])
        if len(groups) > 1 and batch >= 2:
            out.append((batch, (groups[0][0], groups[-1][0])))
    return out


def weight_regressors(adapters: Sequence[ServedAdapter]) -> tuple[int, float]:
    """``byte_tokens`` and ``revision_widths`` of a step holding one token of each of
    ``adapters`` (repeats allowed); (0, 0.0) when a size is unknown."""
    if any(a.size_bytes <= 0 for a in adapters):
        return 0, 0.0
    distinct = dict.fromkeys(adapters)
    return sum(a.size_bytes for a in adapters), math.fsum(a.size_bytes / a.rank for a in distinct)


async def _mix_tpot(
    target: Target, batch: int, chosen: Sequence[ServedAdapter], config: CalibrateConfig, seed: int
) -> float | None:
    """The median TPOT of ``batch`` requests over ``chosen`` sent at once; None if none decoded."""
    rng = random.Random(seed)
    drive = drive_config(target, config)
    now = time.monotonic()
    sends = []
    for i in range(batch):
        adapter = chosen[i % len(chosen)]
        request = TraceRequest(
            0.0, adapter.tenant, adapter.name, config.prompt_tokens, config.output_tokens
        )
        ids = prompt_ids(rng, config.prompt_tokens, target.vocab_size)
        sends.append(
            send_one(
                target.url,
                request,
                key=target.keys[adapter.tenant],
                ids=ids,
                arrival=now,
                tier="L0",
                config=drive,
            )
        )
    records = await asyncio.gather(*sends)
    tpots = [r.tpot_s for r in records if r.ok and r.tpot_s is not None]
    return statistics.median(tpots) if tpots else None


def step_samples(client: httpx.Client, target: Target, config: CalibrateConfig) -> list[StepSample]:
    """One sample per mix (its adapters prefetched into L0 first): the median over the mix's
    repeats of their median TPOT, so one disturbed run (a loaded machine) does not make a
    sample of its own."""
    samples = []
    for index, (batch, chosen) in enumerate(mixes(target.adapters, config)):
        into_slots(client, target.adapters, chosen)
        tpots = []
        for repeat in range(config.repeats):
            seed = config.seed + 1000 * index + repeat
            tpot = asyncio.run(_mix_tpot(target, batch, chosen, config, seed))
            if tpot is not None and tpot > 0:
                tpots.append(tpot)
        if not tpots:
            continue
        rows = [chosen[i % len(chosen)] for i in range(batch)]
        byte_tokens, widths = weight_regressors(rows)
        rank_tokens = sum(a.rank for a in rows)
        step_s = statistics.median(tpots)
        samples.append(
            StepSample(batch, 0, len(chosen), rank_tokens, step_s, False, byte_tokens, widths)
        )
    return samples


def front_seconds(client: httpx.Client, target: Target, config: CalibrateConfig) -> float:
    """front_s: the median latency of an authenticated ``GET /v1/models``."""
    key = target.keys[min(target.adapters, key=lambda a: a.rank).tenant]
    front = []
    for _ in range(config.overhead_requests):
        start = time.perf_counter()
        client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).raise_for_status()
        front.append(time.perf_counter() - start)
    return statistics.median(front)


def prefill_adapters(target: Target) -> tuple[ServedAdapter, ...]:
    """The adapters of the prefill samples: each target set's lowest- and highest-rank one."""
    groups = target_sets(target.adapters)
    return tuple(dict.fromkeys(a for group in groups for a in (group[0], group[-1])))


def prefill_samples(
    client: httpx.Client, target: Target, config: CalibrateConfig, front_s: float
) -> tuple[list[StepSample], list[float], list[tuple[StepSample, float]]]:
    """One hop sample per prefill length and adapter (lowest and highest rank): the median TTFT
    of lone warm requests less ``front_s``; none where that is not > 0. With them, every lone
    request's TTFT less its sample's median (the spread the cost model's ``hop_jitter_s``
    keeps), and every kept sample's lone requests as (sample, TTFT less ``front_s``), whose
    median beyond the fitted step is the hop (``sim/calibrate.median_hop_s``)."""
    chosen = prefill_adapters(target)
    samples, residuals, lone = [], [], []
    into_slots(client, target.adapters, tuple(chosen))
    for adapter in chosen:
        byte_tokens, width = weight_regressors((adapter,))
        for index, length in enumerate(config.prefill_lengths):
            seed = config.seed + 7 + 100 * index + adapter.rank
            ttfts = asyncio.run(_warm_ttfts(target, adapter, config, length, seed))
            step_s = statistics.median(ttfts) - front_s if ttfts else 0.0
            residuals += [t - statistics.median(ttfts) for t in ttfts]
            if step_s > 0:
                rank_tokens = length * adapter.rank
                sample = StepSample(
                    0, length, 1, rank_tokens, step_s, True, length * byte_tokens, width
                )
                samples.append(sample)
                lone += [(sample, t - front_s) for t in ttfts]
    return samples, residuals, lone


async def lone_ttft(
    target: Target,
    adapter: ServedAdapter,
    config: CalibrateConfig,
    length: int,
    rng: random.Random,
    *,
    tier: str = "L0",
) -> float | None:
    """One request of ``length`` prompt tokens and ``max_tokens`` 1 on ``adapter``, alone: its
    TTFT in seconds (None if it failed); ``tier`` is where the caller put the adapter."""
    request = TraceRequest(0.0, adapter.tenant, adapter.name, length, 1)
    record = await send_one(
        target.url,
        request,
        key=target.keys[adapter.tenant],
        ids=prompt_ids(rng, length, target.vocab_size),
        arrival=time.monotonic(),
        tier=tier,
        config=drive_config(target, config),
    )
    return record.ttft_s if record.ok else None


def hop_requests(
    adapter: ServedAdapter, config: CalibrateConfig, length: int
) -> list[TraceRequest]:
    """The lone warm requests of one prefill sample, paced (``paced_requests``)."""
    return paced_requests(
        adapter.tenant, adapter.name, length, count=config.overhead_requests,
        gap_s=config.hop_gap_s, output_tokens=config.hop_output_tokens,
    )  # fmt: skip


async def _warm_ttfts(
    target: Target, adapter: ServedAdapter, config: CalibrateConfig, length: int, seed: int
) -> list[float]:
    """The TTFTs of one prefill sample's lone warm requests, replayed as ``bench sim`` replays a
    trace (its client, its arrival clock, its residency poller)."""
    drive = replace(drive_config(target, config), seed=seed)
    requests = hop_requests(adapter, config, length)
    records, _ = await replay_over_http(target.url, requests, target.keys, target.admin_key, drive)
    return [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
