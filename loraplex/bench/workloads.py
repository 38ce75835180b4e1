"""The named benchmark workloads of WORKLOADS.md: popularity, arrivals, lengths, ranks, traces.

Torch-free and deterministic: every draw comes from one seeded ``random.Random``, so a scenario's
name and seed are its trace: the real server's and the cache-only replay's benchmarks generate
the same requests in memory.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

S2_RANKS = (64, 32, 16, 8)
WIDE_RANKS = (8, 16, 32, 64, 128)
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL_TARGETS = (*ATTENTION_TARGETS, "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace."""

    t_s: float  # arrival, seconds from the start of the run
    tenant: str  # the requesting tenant (owns the adapter)
    adapter: str  # adapter name within the tenant
    prompt_tokens: int  # prompt length
    output_tokens: int  # tokens to generate


@dataclass(frozen=True)
class TraceAdapter:
    """One adapter a workload uses (sizes for the cache follow from rank and targets)."""

    tenant: str  # owning tenant
    name: str  # adapter name
    rank: int  # LoRA rank
    targets: tuple[str, ...]  # target modules


@dataclass(frozen=True)
class Workload:
    """A generated workload: its adapters and its requests in arrival order."""

    name: str  # scenario name
    seed: int  # generator seed
    duration_s: float  # length of the run
    adapters: tuple[TraceAdapter, ...]  # every adapter, most popular first where it matters
    requests: tuple[TraceRequest, ...]  # sorted by t_s


def adapter_union(groups: Iterable[Iterable[TraceAdapter]]) -> tuple[TraceAdapter, ...]:
    """Every adapter of ``groups`` once per (tenant, name), the first seen kept, in first-seen
    order: what a registry shared by several workloads registers."""
    seen: dict[tuple[str, str], TraceAdapter] = {}
    for group in groups:
        for adapter in group:
            seen.setdefault((adapter.tenant, adapter.name), adapter)
    return tuple(seen.values())


# --- popularity ------------------------------------------------------------------------------


def zipf_weights(n: int, s: float) -> list[float]:
    """Adapter i (1-based, by popularity) has weight i**-s."""
    _positive("n", n)
    return [(i + 1) ** -s for i in range(n)]


def slora_power_index(rng: random.Random, n: int, alpha: float) -> int:
    """S-LoRA's draw: u ~ numpy ``power(alpha)`` (density alpha*u**(alpha-1) on [0, 1]),
    adapter floor(u*n). NOTE: alpha = 1 is uniform; smaller alpha is more skewed."""
    if alpha <= 0:
        raise ValueError(f"alpha {alpha} is invalid; expected > 0")
    u = rng.random() ** (1.0 / alpha)
    return min(n - 1, int(u * n))


def gamma_arrivals(rng: random.Random, rate: float, cv: float, duration_s: float) -> list[float]:
    """Arrival times of a Gamma renewal process with mean rate ``rate`` and coefficient of
    variation ``cv`` (cv = 1: Poisson) over ``[0, duration_s)``."""
    if rate <= 0 or cv <= 0:
        raise ValueError(f"rate {rate} / cv {cv} is invalid; expected both > 0")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.gammavariate(shape, scale)
        if t >= duration_s:
            return times
        times.append(t)


def assign_ranks(num_adapters: int, ranks: Sequence[int]) -> list[int]:
    """Round-robin rank assignment (``S2_RANKS``; ``WIDE_RANKS`` gives equal counts)."""
    return [ranks[i % len(ranks)] for i in range(num_adapters)]


def make_adapters(tenant: str, prefix: str, count: int, ranks: Sequence[int]) -> list[TraceAdapter]:
    """``count`` adapters with round-robin ranks; targets alternate attention-only / all."""
    return [
        TraceAdapter(tenant, f"{prefix}{i:04d}", rank, ATTENTION_TARGETS if i % 2 else ALL_TARGETS)
        for i, rank in enumerate(assign_ranks(count, ranks))
    ]


# --- scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioParams:
    """Knobs shared by the named scenarios."""

    duration_s: float = 600.0  # length of the run
    rate: float = 20.0  # mean requests per second
    cv: float = 1.0  # arrival coefficient of variation
    prompt_tokens: int = 64  # fixed short lengths for cache studies
    output_tokens: int = 16  # ditto
    num_adapters: int = 256  # zipf-longtail / drift / uniform population

    def __post_init__(self) -> None:
        for name in ("duration_s", "rate", "cv", "prompt_tokens", "output_tokens", "num_adapters"):
            value = getattr(self, name)
            if not 0 < value < math.inf:  # NOTE: a nan or inf length never ends its generator
                raise ValueError(f"{name} {value} is invalid; expected a finite number > 0")


class RequestShape:
    """Base of a frozen config dataclass whose traces' rate and length are known only at run
    time (``bench serve``'s and ``bench fleet``'s: from the measured capacity). Each config
    declares the fields itself, with its own defaults (a plain base class's annotations are not
    dataclass fields; they tell the type checker what ``params`` reads)."""

    prompt_tokens: int  # prompt length of every request
    output_tokens: int  # max tokens of every request
    num_adapters: int  # zipf-longtail's population (and cold-storm's storm pool)

    def params(self, rate: float, duration_s: float) -> ScenarioParams:
        """The generators' parameters of a trace at ``rate`` for ``duration_s``."""
        return ScenarioParams(
            duration_s=duration_s,
            rate=rate,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            num_adapters=self.num_adapters,
        )


HOT_BURST_WINDOW = (0.3, 0.5)  # hot-burst's sweep, as fractions of the run
HOT_BURST_SWEEP_TENANT = "batch"  # the tenant whose cold adapters hot-burst's sweep uses


def hot_burst(seed: int, p: ScenarioParams) -> Workload:
    """8 hot adapters of a priority tenant carry a steady 80% of traffic; from 30% to 50% of
    the run a batch tenant sweeps 40 cold adapters, each used 1-3 times in a row."""
    rng = random.Random(seed)
    hot = make_adapters("prio", "hot", 8, S2_RANKS)
    cold = make_adapters(HOT_BURST_SWEEP_TENANT, "cold", 40, S2_RANKS)
    start, end = (share * p.duration_s for share in HOT_BURST_WINDOW)
    hot_times = gamma_arrivals(rng, 0.8 * p.rate, p.cv, p.duration_s)
    picks = [(t, hot[rng.randrange(len(hot))]) for t in hot_times]
    sweep = [a for a in cold for _ in range(rng.randint(1, 3))]
    sweep_times = [start + (end - start) * (i + 0.5) / len(sweep) for i in range(len(sweep))]
    picks += list(zip(sweep_times, sweep, strict=True))
    return _workload("hot-burst", seed, p, (*hot, *cold), picks)


HOT_ONE_SHARE = 0.6  # hot-one's hot revision: this share of the requests
HOT_ONE_TENANT = "hot"  # the tenant owning hot-one's hot revision
HOT_ONE_TAIL_TENANT = "tail"  # the tenant owning hot-one's Zipf tail


def hot_one(seed: int, p: ScenarioParams) -> Workload:
    """One hot revision carries ``HOT_ONE_SHARE`` (60 %) of the requests; the rest is zipf(1.0)
    over ``num_adapters - 1`` tail adapters of another tenant (S2 ranks); Gamma arrivals. The
    case where one revision's demand exceeds a replica (bench fleet sets the rate so that it
    does): a router must spread it, pure affinity keeps it on its one holder."""
    if p.num_adapters < 2:
        raise ValueError(f"num_adapters {p.num_adapters} is invalid; hot-one expects >= 2")
    rng = random.Random(seed)
    (hot,) = make_adapters(HOT_ONE_TENANT, "hot", 1, S2_RANKS)
    tail = make_adapters(HOT_ONE_TAIL_TENANT, "ad", p.num_adapters - 1, S2_RANKS)
    weights = zipf_weights(len(tail), 1.0)
    picks = [
        (t, hot if rng.random() < HOT_ONE_SHARE else rng.choices(tail, weights)[0])
        for t in gamma_arrivals(rng, p.rate, p.cv, p.duration_s)
    ]
    return _workload("hot-one", seed, p, (hot, *tail), picks)


def zipf_longtail(seed: int, p: ScenarioParams, s: float = 1.0) -> Workload:
    """``num_adapters`` adapters (S2 ranks), zipf(s) popularity, Gamma arrivals."""
    rng = random.Random(seed)
    adapters = make_adapters("tenant", "ad", p.num_adapters, S2_RANKS)
    weights = zipf_weights(len(adapters), s)
    times = gamma_arrivals(rng, p.rate, p.cv, p.duration_s)
    picks = list(zip(times, rng.choices(adapters, weights, k=len(times)), strict=True))
    return _workload("zipf-longtail", seed, p, adapters, picks)


def drift(seed: int, p: ScenarioParams, phases: int = 5) -> Workload:
    """zipf(1.0) whose popularity order is reshuffled every 1/``phases`` of the run."""
    rng = random.Random(seed)
    adapters = make_adapters("tenant", "ad", p.num_adapters, S2_RANKS)
    weights = zipf_weights(len(adapters), 1.0)
    orders = [rng.sample(adapters, len(adapters)) for _ in range(phases)]
    times = gamma_arrivals(rng, p.rate, p.cv, p.duration_s)
    picks = []
    for t in times:
        order = orders[min(phases - 1, int(t / p.duration_s * phases))]
        picks.append((t, rng.choices(order, weights)[0]))
    return _workload("drift", seed, p, adapters, picks)


def cold_storm(seed: int, p: ScenarioParams) -> Workload:
    """One tenant fires requests for many distinct cold adapters while two others run steady
    zipf traffic over their own small sets."""
    rng = random.Random(seed)
    steady = [make_adapters(t, "ad", 16, S2_RANKS) for t in ("steady-a", "steady-b")]
    storm = make_adapters("storm", "cold", p.num_adapters, WIDE_RANKS)
    weights = zipf_weights(16, 1.0)
    picks = []
    for group in steady:
        for t in gamma_arrivals(rng, 0.35 * p.rate, p.cv, p.duration_s):
            picks.append((t, rng.choices(group, weights)[0]))
    for t in gamma_arrivals(rng, 0.3 * p.rate, p.cv, p.duration_s):
        picks.append((t, storm[rng.randrange(len(storm))]))
    return _workload("cold-storm", seed, p, (*steady[0], *steady[1], *storm), picks)


def uniform(seed: int, p: ScenarioParams) -> Workload:
    """slora_power(1.0) over 200 adapters: the no-locality worst case."""
    rng = random.Random(seed)
    adapters = make_adapters("tenant", "ad", 200, S2_RANKS)
    times = gamma_arrivals(rng, p.rate, p.cv, p.duration_s)
    picks = [(t, adapters[slora_power_index(rng, len(adapters), 1.0)]) for t in times]
    return _workload("uniform", seed, p, adapters, picks)


SCENARIOS: dict[str, Callable[[int, ScenarioParams], Workload]] = {
    "hot-burst": hot_burst,
    "hot-one": hot_one,
    "zipf-longtail": zipf_longtail,
    "drift": drift,
    "cold-storm": cold_storm,
    "uniform": uniform,
}


def generate(name: str, seed: int = 0, params: ScenarioParams | None = None) -> Workload:
    """A named scenario (``SCENARIOS``), deterministic in ``seed``."""
    if name not in SCENARIOS:
        raise ValueError(f"scenario {name!r} is unknown; expected one of {sorted(SCENARIOS)}")
    return SCENARIOS[name](seed, params or ScenarioParams())


def _workload(
    name: str,
    seed: int,
    p: ScenarioParams,
    adapters: Sequence[TraceAdapter],
    picks: Sequence[tuple[float, TraceAdapter]],
) -> Workload:
    ordered = sorted(picks, key=lambda pick: (pick[0], pick[1].tenant, pick[1].name))
    requests = tuple(
        TraceRequest(round(t, 6), a.tenant, a.name, p.prompt_tokens, p.output_tokens)
        for t, a in ordered
    )
    return Workload(name, seed, p.duration_s, tuple(adapters), requests)


def _positive(field: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{field} {value} is invalid; expected >= 1")


def trace_params(
    trace_requests: int, rate: float, prompt_tokens: int, output_tokens: int, num_adapters: int
) -> ScenarioParams:
    """The scenario parameters of a trace of about ``trace_requests`` at ``rate`` per second;
    ValueError naming the field when a count is below 1 or the rate is not positive."""
    counts = {"trace_requests": trace_requests, "num_adapters": num_adapters,
              "prompt_tokens": prompt_tokens, "output_tokens": output_tokens}  # fmt: skip
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} {value} is invalid; expected >= 1")
    if not rate > 0:
        raise ValueError(f"rate {rate} is invalid; expected > 0")
    return ScenarioParams(
        duration_s=trace_requests / rate,
        rate=rate,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        num_adapters=num_adapters,
    )
