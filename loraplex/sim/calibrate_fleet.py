"""The fleet's calibration fit (``loraplex sim calibrate-fleet``): a lone server's cost model plus
what a fleet adds, from lone warm requests sent through a running fleet's ingress.

Torch-free and HTTP-free: ``bench/sim/calibrate_fleet.py`` measures, this module fits.

- ``fleet_cpu_scale``: the median, over lone decode requests (nothing else running), of
  their TPOT over the base model's price of a one-token decode step of their adapter: a
  replica's step co-located with the fleet's other processes, against a lone server's.
- ``network_s``: the median, over lone prefill requests (``max_tokens`` 1), of their TTFT less
  the base model's lone-server TTFT of the same request (``front_s + ipc_s`` and the prefill
  step, scaled as above), floored at 0: the ingress-to-replica hop.
- ``network_jitter_s``: the quantiles of each lone prefill request's TTFT less its group's
  median (prompt length and adapter), as ``hop_jitter_s`` is measured on one server.
- ``fleet_contention``: the fleet's throughput with ``k`` requests kept in flight (k = 1, 2,
  4, 8; closed loop, warm adapters), as the slowdown per request ``k * X(1) / X(k)`` (the median
  throughput of each ``k``'s rounds), floored at 1 (the raw values are kept): the CPU work the
  fleet's processes add per request, which lone requests cannot show (``sim/cpu.py``).
- ``cores``: given by the caller (the machine's usable cores where the fleet ran).
- ``fleet_load_scale`` (``fit_load_scale``; measured by ``sim calibrate-fleet``'s lone cold
  requests and by ``bench sim``'s fleet passes): the median, over lone cold requests (their
  adapter in no replica: a load from the store), of the load's stage seconds as the fleet's
  replicas counted them (``FleetSample.load_stages_s``: the fleet's stage counters read around
  the request, as ``sim calibrate`` times the lone server's links) over the load's lone price
  (L3 -> L2, L2 -> L1, L1 -> L0 of its bytes; each request's ratio: ``stage_load_ratios``): a
  fleet replica's load against a lone server's, which a decode step's ratio
  (``fleet_cpu_scale``) priced before. Refused with fewer than ``MIN_STAGE_SAMPLES`` timed
  requests. Before 2026-12-06 (simstage) the ratio was each request's TTFT less what the model
  prices around its load (``ttft_load_ratios``, kept for the reports): a residual of residuals
  that ranged 0.115-1.164 over one invocation's fits.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from loraplex.sim.calibrate import jitter_quantiles
from loraplex.sim.cost_model import CostModel
from loraplex.sim.cpu import Contention

LOAD_LINKS = ("L3_to_L2", "L2_to_L1", "L1_to_L0")  # a load from the store, link by link


@dataclass(frozen=True)
class FleetSample:
    """One lone warm request through the fleet: its shape and what the client measured."""

    prompt_tokens: int  # its prompt
    rank: int  # its adapter's rank
    nbytes: int  # its adapter's A+B bytes as served
    ttft_s: float  # arrival to first token
    tpot_s: float | None = None  # seconds per output token after the first; None: a prefill one
    cold: bool = False  # its adapter was in no replica (a load from the store): fit_load_scale's
    # a cold one's load: the stage seconds per link (``LOAD_LINKS``) the fleet's stage counters
    # grew by around its request; None: not read (or the counters did not grow)
    load_stages_s: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.rank < 1 or self.nbytes < 1:
            raise ValueError(f"FleetSample {self} is invalid; expected counts >= 1")
        for value in (self.ttft_s, self.tpot_s):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"FleetSample {self} is invalid; expected seconds > 0")
        stages = self.load_stages_s
        if stages is None:
            return
        stages = tuple(stages)  # a list where read back from a report's JSON
        if (
            not self.cold
            or len(stages) != len(LOAD_LINKS)
            or not all(v >= 0 and math.isfinite(v) for v in stages)
            or sum(stages) <= 0
        ):
            raise ValueError(
                f"FleetSample {self} is invalid; expected load_stages_s of a cold request: "
                f"{len(LOAD_LINKS)} finite seconds >= 0 ({', '.join(LOAD_LINKS)}), summing > 0"
            )
        object.__setattr__(self, "load_stages_s", stages)

    def prefill_price_s(self, base: CostModel) -> float:
        """The base model's prefill step of this request (one revision, its prompt)."""
        p = self.prompt_tokens
        return base.step.seconds(
            0, p, 1, p * self.rank, byte_tokens=p * self.nbytes,
            revision_widths=self.nbytes / self.rank,
        )  # fmt: skip

    def decode_price_s(self, base: CostModel) -> float:
        """The base model's one-token decode step of this request's adapter."""
        return base.step.seconds(
            1, 0, 1, self.rank, byte_tokens=self.nbytes, revision_widths=self.nbytes / self.rank
        )


@dataclass(frozen=True)
class ContentionSample:
    """One round of ``in_flight`` requests kept in flight through the fleet (a closed loop)."""

    in_flight: int  # requests in flight throughout
    requests_per_s: float  # completed requests over the round's wall time
    # the median TTFT of the round's completed requests (what the hop and the prefill step
    # met, apart from the decodes the rate holds too); None: not recorded (before SIMFLEET3)
    ttft_s: float | None = None

    def __post_init__(self) -> None:
        rate = self.requests_per_s
        if self.in_flight < 1 or not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"ContentionSample {self} is invalid; expected >= 1 and rate > 0")


def round_medians(samples: Sequence[ContentionSample]) -> dict[int, float]:
    """The median throughput X(k) of the rounds at each ``in_flight`` k, ascending; refused
    without one-request rounds and one other count."""
    rates: dict[int, list[float]] = defaultdict(list)
    for sample in samples:
        rates[sample.in_flight].append(sample.requests_per_s)
    if 1 not in rates or len(rates) < 2:
        raise ValueError(
            f"contention samples cover in_flight {sorted(rates)}; expected 1 and at least one more"
        )
    return {k: statistics.median(rates[k]) for k in sorted(rates)}


def round_ttfts(samples: Sequence[ContentionSample]) -> dict[int, float | None]:
    """The median over its rounds of each in-flight count's median TTFT (None: not recorded)."""
    ttfts: dict[int, list[float | None]] = defaultdict(list)
    for sample in samples:
        ttfts[sample.in_flight].append(sample.ttft_s)
    return {
        k: None if None in v else statistics.median(t for t in v if t is not None)
        for k, v in sorted(ttfts.items())
    }


def fit_contention(samples: Sequence[ContentionSample]) -> tuple[Contention, tuple[float, ...]]:
    """The slowdown per request at each measured ``in_flight`` (module docstring), and the raw
    values before the floor at 1; refused without one-request rounds and one other count."""
    medians = round_medians(samples)
    counts = tuple(medians)
    raw = tuple(k * medians[1] / medians[k] for k in counts)
    stretch = (1.0, *(max(1.0, r) for r in raw[1:]))
    return Contention(counts, stretch), raw


@dataclass(frozen=True)
class FleetFit:
    """The fleet terms and how they were found."""

    fleet_cpu_scale: float
    network_s: float
    network_jitter_s: tuple[float, ...]
    prefill_samples: int
    decode_samples: int
    raw_network_s: float  # the median before the floor at 0


def fit_fleet(base: CostModel, samples: Sequence[FleetSample]) -> FleetFit:
    """The fleet terms (module docstring); refused without two prefill and one decode sample."""
    decodes = [s for s in samples if s.tpot_s is not None and not s.cold]
    prefills = [s for s in samples if s.tpot_s is None and not s.cold]
    if len(prefills) < 2 or not decodes:
        raise ValueError(
            f"fleet samples are too few ({len(prefills)} prefill, {len(decodes)} decode); "
            "expected >= 2 lone prefill requests and >= 1 lone decode request"
        )
    scale = statistics.median(s.tpot_s / s.decode_price_s(base) for s in decodes if s.tpot_s)
    lone_s = base.front_s + base.ipc_s
    raw = statistics.median(s.ttft_s - lone_s - scale * s.prefill_price_s(base) for s in prefills)
    groups: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for s in prefills:
        groups[(s.prompt_tokens, s.rank, s.nbytes)].append(s.ttft_s)
    residuals = [t - statistics.median(ts) for ts in groups.values() for t in ts]
    return FleetFit(
        scale, max(0.0, raw), jitter_quantiles(residuals), len(prefills), len(decodes), raw
    )


MIN_STAGE_SAMPLES = 3  # fit_load_scale's fewest cold requests with their load's stage seconds


def load_price_s(model: CostModel, sample: FleetSample) -> float:
    """The lone price of ``sample``'s load from the store: its three links (``LOAD_LINKS``)."""
    return sum(model.links[name].seconds(sample.nbytes) for name in LOAD_LINKS)


def ttft_load_ratios(model: CostModel, samples: Sequence[FleetSample]) -> list[float]:
    """Each of ``samples``' cold ones' TTFT less what ``model`` (its fleet terms fitted) prices
    around its load (the hop, the ask, the L3 hand-off and the scaled prefill step), over the
    load's lone price, in their order; unfloored. The fit before simstage; the reports keep it
    beside ``stage_load_ratios``."""
    hop = model.front_s + model.ipc_s + model.network_s
    around = hop + model.lease_ask_s + model.lease_handoff_s.get("L3", 0.0)
    return [
        (s.ttft_s - around - model.fleet_cpu_scale * s.prefill_price_s(model))
        / load_price_s(model, s)
        for s in samples
        if s.cold
    ]


def stage_timed(samples: Sequence[FleetSample]) -> list[FleetSample]:
    """``samples``' cold ones whose load's stage seconds were read, in their order."""
    return [s for s in samples if s.cold and s.load_stages_s is not None]


def stage_load_ratios(model: CostModel, samples: Sequence[FleetSample]) -> list[float]:
    """Each stage-timed cold sample's load stage seconds over its load's lone price under
    ``model``'s links, in their order."""
    return [sum(s.load_stages_s or ()) / load_price_s(model, s) for s in stage_timed(samples)]


@dataclass(frozen=True)
class LoadScaleFit:
    """``fit_load_scale``'s result."""

    scale: float  # the median of ``ratios``: ``fleet_load_scale``
    ratios: tuple[float, ...]  # each timed request's, in the order sent
    # per link: the median of each timed request's stage seconds on it over the link's price
    link_ratios: dict[str, float]

    @property
    def samples(self) -> int:
        return len(self.ratios)


def fit_load_scale(
    model: CostModel, samples: Sequence[FleetSample], min_samples: int = MIN_STAGE_SAMPLES
) -> LoadScaleFit:
    """``fleet_load_scale`` (module docstring) from ``samples``' stage-timed cold ones over
    ``model``'s links; refused (ValueError) with fewer than ``min_samples`` of them."""
    timed = stage_timed(samples)
    if len(timed) < min_samples:
        colds = sum(s.cold for s in samples)
        raise ValueError(
            f"fleet_load_scale has too few samples: {len(timed)} cold requests with their "
            f"load's stage seconds ({colds} cold in all); expected >= {min_samples}"
        )
    ratios = tuple(stage_load_ratios(model, timed))
    links = {
        name: statistics.median(
            (s.load_stages_s or ())[i] / model.links[name].seconds(s.nbytes) for s in timed
        )
        for i, name in enumerate(LOAD_LINKS)
    }
    return LoadScaleFit(statistics.median(ratios), ratios, links)


def fleet_model(
    base: CostModel, fit: FleetFit, cores: int, sources: dict[str, str],
    contention: Contention | None = None,
) -> CostModel:  # fmt: skip
    """``base`` with the fleet terms of ``fit``, the machine's ``cores`` and the fleet's
    ``contention`` when measured; ``sources`` (the fleet run's command, date, machine and method
    per key) are added to the base's."""
    return replace(
        base,
        network_s=fit.network_s,
        network_jitter_s=fit.network_jitter_s,
        fleet_cpu_scale=fit.fleet_cpu_scale,
        cores=cores,
        fleet_contention=contention,
        sources={**base.sources, **sources},
    )
