"""The fleet's contention curve fitted by simulation (``sim calibrate-fleet``).

The first-pass curve (``sim/calibrate_fleet.fit_contention``: ``k x X(1) / X(k)`` from the
measured rounds) is the whole slowdown a request met with ``k`` in flight, queueing included.
The simulator charges the curve on top of its own batching and queueing, and on every hop as
well as every step, so replaying the calibration's own rounds in the simulator with that curve
gave less than the measured throughput (SIMFLEET2: 20.9 against 25.8 requests/s at k = 8;
2026-12-05: 16.8 against 25.6). Here the rounds are replayed in the simulator (closed loop:
each client's next request arrives when its last ended, iterated to a fixed point) and each
point of the curve is scaled until the simulated throughput relative to one client matches the
measured one: ``stretch(k) <- max(1, stretch(k) x r_sim(k) / r_measured(k))`` with
``r(k) = X(k) / X(1)``; at most ``MAX_ITERATIONS`` passes, stopping once every point is within
``TOLERANCE``. The simulator's rule (``sim/cpu.py``) is unchanged; only the file's numbers are.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.cpu import Contention
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

MAX_ITERATIONS = 12  # passes over the curve's points
TOLERANCE = 0.02  # relative gap between simulated and measured r(k) that ends the fit
MAX_FIXED_POINT = 50  # closed-loop replays per rate (rounds.py's bound)
START_S = 5.0  # the rounds start after the warm-up requests
WARM_GAP_S = 0.5  # between warm-up requests


@dataclass(frozen=True)
class RoundShape:
    """What a contention round sends (``bench/sim/calibrate_fleet``'s constants)."""

    adapters: tuple[
        tuple[str, str, int, int], ...
    ]  # (tenant, name, rank, bytes), client i: i mod n
    per_client: int  # requests each client sends back to back
    prompt_tokens: int
    output_tokens: int

    def record(self, t_s: float, client: int) -> TraceRecord:
        tenant, name, rank, nbytes = self.adapters[client % len(self.adapters)]
        return TraceRecord(t_s, tenant, name, self.prompt_tokens, self.output_tokens, rank, nbytes)


def _warm(shape: RoundShape) -> list[TraceRecord]:
    """Two warm-up requests per adapter, ``WARM_GAP_S`` apart (the calibration warms each
    before the rounds)."""
    return [
        shape.record(WARM_GAP_S * i, i % len(shape.adapters))
        for i in range(2 * len(shape.adapters))
    ]


def warm_replicas(model: CostModel, config: SimConfig, shape: RoundShape) -> list[int]:
    """The replica each of ``shape``'s adapters is in after the warm-up, in the simulator (its
    second warm-up request's)."""
    warm = _warm(shape)
    outcomes: list[Outcome] = []
    simulate(warm, config, model, keep_outcomes=outcomes)
    count = len(shape.adapters)
    return [outcomes[count + i].replica for i in range(count)]


def simulated_rate(model: CostModel, config: SimConfig, shape: RoundShape, clients: int) -> float:
    """Completed requests per second of ``clients`` closed-loop clients in the simulator, after
    the warm-up (``_warm``)."""
    return simulated_round(model, config, shape, clients)[0]


def simulated_round(
    model: CostModel, config: SimConfig, shape: RoundShape, clients: int
) -> tuple[float, float]:
    """``simulated_rate`` and the round's median TTFT (seconds) in the simulator."""
    warm = _warm(shape)
    start = max(START_S, warm[-1].t_s + 1.0)
    arrivals = [[start] * shape.per_client for _ in range(clients)]
    ends: dict[tuple[int, int], float] = {}
    ttfts: list[float] = []
    for _ in range(MAX_FIXED_POINT):
        rows = sorted((t, c, i) for c in range(clients) for i, t in enumerate(arrivals[c]))
        outcomes: list[Outcome] = []
        trace = warm + [shape.record(t, c) for t, c, _ in rows]
        simulate(trace, config, model, keep_outcomes=outcomes)
        ends = {(c, i): _end(o) for (_, c, i), o in zip(rows, outcomes[len(warm) :], strict=True)}
        ttfts = [o.first_token_s - o.t_s for o in outcomes[len(warm) :] if o.first_token_s]
        new = [
            [start] + [ends[(c, i)] for i in range(shape.per_client - 1)] for c in range(clients)
        ]
        moved = max(
            abs(a - b)
            for x, y in zip(new, arrivals, strict=True)
            for a, b in zip(x, y, strict=True)
        )
        arrivals = new
        if moved < 1e-9:
            break
    rate = clients * shape.per_client / (max(ends.values()) - start)
    return rate, statistics.median(ttfts)


def _end(outcome: Outcome) -> float:
    if outcome.end_s is None:  # every simulated request ends (simulate checks)
        raise RuntimeError(f"a simulated contention request did not end: {outcome}")
    return outcome.end_s


@dataclass(frozen=True)
class ContentionFit:
    """The fitted curve and how it was found."""

    contention: Contention
    iterations: int  # passes run
    simulated_first: dict[int, float]  # X(k) simulated with the first-pass curve
    simulated_fitted: dict[int, float]  # X(k) simulated with the fitted curve
    measured: dict[int, float]  # X(k) measured (the rounds' medians)
    worst_gap: float  # max over k of |r_sim(k) / r_measured(k) - 1| with the fitted curve
    # the simulated rounds' median TTFT (seconds) with the fitted curve, beside the measured
    # rounds' (``ContentionSample.ttft_s``): the rate cannot tell a hop's stretch from a step's
    simulated_ttft_s: dict[int, float] = field(default_factory=dict)


def fit_by_simulation(
    model: CostModel, config: SimConfig, shape: RoundShape, measured: Mapping[int, float],
    first: Contention,
) -> ContentionFit:  # fmt: skip
    """``first`` rescaled so that the simulator replaying the rounds reproduces ``measured``
    relative to one client (module docstring). ``model`` is the fleet's file without a curve
    or with any: its curve is replaced."""
    counts = first.in_flight
    if set(counts) != set(measured) or counts[0] != 1:
        raise ValueError(f"measured counts {sorted(measured)} do not match the curve's {counts}")
    wanted = {k: measured[k] / measured[1] for k in counts}

    ttft: dict[int, float] = {}

    def rates(curve: Contention) -> dict[int, float]:
        charged = replace(model, fleet_contention=curve)
        replayed = {k: simulated_round(charged, config, shape, k) for k in counts}
        ttft.clear()
        ttft.update({k: t for k, (_, t) in replayed.items()})
        return {k: rate for k, (rate, _) in replayed.items()}

    stretch = list(first.stretch)
    simulated = first_rates = rates(first)
    iterations, gap = 0, _gap(simulated, wanted)
    while gap > TOLERANCE and iterations < MAX_ITERATIONS:
        before = tuple(stretch)
        for i, k in enumerate(counts[1:], start=1):
            stretch[i] = max(1.0, stretch[i] * (simulated[k] / simulated[1]) / wanted[k])
        if tuple(stretch) == before:  # every point at the floor that would move: nothing left
            break
        iterations += 1
        simulated = rates(Contention(counts, tuple(stretch)))
        gap = _gap(simulated, wanted)
    return ContentionFit(
        Contention(counts, tuple(stretch)), iterations, first_rates, simulated,
        dict(measured), gap, dict(ttft),
    )  # fmt: skip


def _gap(simulated: Mapping[int, float], wanted: Mapping[int, float]) -> float:
    """The worst relative gap between simulated and wanted throughput relative to one client
    (a point at the floor 1 that the simulator runs slower than measured counts too)."""
    return max(abs(simulated[k] / simulated[1] / wanted[k] - 1.0) for k in wanted)
