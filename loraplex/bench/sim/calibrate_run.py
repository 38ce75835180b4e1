"""``loraplex sim calibrate``'s measurements of a server (``calibrate_target``), fitted by
``sim/calibrate.py`` into a validated cost-model file (``calibration.measure`` runs them in
order, with the cold requests of ``calibrate_cold``). Here: what a calibration measures
(``CalibrateConfig``), the pacing of lone requests, the decode mixes and ``front_s``; the prefill
samples are ``calibrate_prefill.py``'s, the tier links' cold loads ``calibrate_loads.py``'s.

- Decode steps: controlled mixes sent at once (``batch`` requests over ``revisions`` distinct
  adapters, the lowest or the highest ranks of each target set, and with two target sets both
  sets' lowest ranks together), every adapter in a GPU slot first; each request
  decodes ``output_tokens`` tokens with ``ignore_eos``, so while they run each engine step holds
  ``batch`` decode tokens, and the median time per output token (TPOT) is the step time of that
  mix, timed on the engine's clock where the server's request log is at hand
  (``calibrate_decode.py``, which runs the mixes).
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

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
from loraplex.bench.workloads import TraceRequest
from loraplex.residency.warm import default_auto_gpu_slots

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


def target_sets(adapters: Sequence[ServedAdapter]) -> list[list[ServedAdapter]]:
    """The adapters grouped by bytes per rank (one group per target set; one group when no
    size is known), each group by rank, the narrowest group first."""
    groups: dict[float, list[ServedAdapter]] = {}
    for adapter in adapters:
        groups.setdefault(adapter.size_bytes / adapter.rank, []).append(adapter)
    return [
        sorted(groups[width], key=lambda a: (a.rank, a.tenant, a.name)) for width in sorted(groups)
    ]


def slots_for_mixes(config: CalibrateConfig) -> int:
    """The fewest GPU slots that hold the largest mix's distinct adapters beside the automatic
    GPU pins (``max_auto_gpu_slots``, a quarter of the slots as the calibration's server leaves
    it) of adapters outside the mix, which ``into_slots`` cannot evict: with fewer its prefetch
    may be refused (503). The one tenant's ``default_tenant_tier_share`` does not count: a
    share is work-conserving (``residency/reclaim.py``), and ``into_slots`` frees the other
    slots, which the tenant borrows.
    NOTE: sized by the share as a hard cap (``max / share``: 8 slots at the defaults) before
    the share became work-conserving, it asked for more slots than the mixes use."""
    need = max(config.revision_counts)
    slots = need
    while slots - default_auto_gpu_slots(slots) < need:
        slots += 1
    return slots


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


def front_seconds(client: httpx.Client, target: Target, config: CalibrateConfig) -> float:
    """front_s: the median latency of an authenticated ``GET /v1/models``."""
    key = target.keys[min(target.adapters, key=lambda a: a.rank).tenant]
    front = []
    for _ in range(config.overhead_requests):
        start = time.perf_counter()
        client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).raise_for_status()
        front.append(time.perf_counter() - start)
    return statistics.median(front)
