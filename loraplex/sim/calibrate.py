"""Calibration: measured samples in, a cost model (``cost_model.CostModel``) out.

Torch-free and HTTP-free: the measuring side (``bench/sim/calibrate_run.py``) talks to a server
and hands this module plain samples; here they are fitted. Step time is fitted by least squares
on the cost model's five regressors (constant, decode tokens, prompt tokens, distinct revisions,
rank-tokens); a coefficient the data drives below zero is dropped (fixed at 0) and the rest
refitted, because a negative cost is physically meaningless and the cost model refuses it.

Decode samples (a mix's time per output token) are steps alone. Prefill samples are a lone warm
request's TTFT less ``front_s``: one prefill step plus the front-to-engine hop, the time the
simulator charges as ``ipc_s`` before the step. They carry ``hop`` = 1, a sixth regressor whose
coefficient is ``ipc_s``: fitted with the step terms, not left over after them, so the prompt
term, the constant and the hop are each identified (the decode samples have no hop). With every
lone request's TTFT at hand, the cost model's ``ipc_s`` is their median beyond the fitted step
instead (``median_hop_s``: a few disturbed samples move the coefficient whole). Each tier
link is a straight line, seconds = fixed_s + bytes / bytes_per_s, fitted the same way per link.

Prefill samples timed on the engine's own timeline (``sim calibrate --self``: the server's
request log holds each lone request's first step, planned to ended) are steps alone, like the
decode samples: ``hop`` false, prompt tokens > 0. With them the fit has a prefill-step column in
place of the hop column (1 for a step holding prompt tokens), whose coefficient is
``StepCost.per_prefill_step_s`` (what a prefill step costs beyond its tokens: the decode line
over-prices a prompt token and under-prices the prompt path's fixed work, and without the term
that remainder landed in ``ipc_s``), and ``ipc_s`` is then ``median_hop_s`` of the lone
requests' TTFTs beyond the step so priced. In a TTFT-based fit the prefill-step column and the
hop column are the same column, so the two kinds of prefill sample are never fitted together.

Samples that carry their adapters' bytes (``byte_tokens``, ``revision_widths``) fit the two LoRA
weight terms too (``cost_model.StepCost.per_byte_token_s``, ``per_revision_width_s``); they are
identified only by adapters of several ranks *and* several target sets (bytes per rank), which
the fit then requires. Samples without bytes fit the older five-term model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from loraplex.sim.cost_model import LINKS, CostModel, Link, StepCost

STEP_TERMS = (
    "step_fixed_s",
    "per_token_s",
    "per_prefill_token_s",
    "per_revision_s",
    "per_rank_token_s",
)
WEIGHT_TERMS = ("per_byte_token_s", "per_revision_width_s")  # fitted when samples carry bytes
PREFILL_STEP_TERM = "per_prefill_step_s"  # fitted when prefill samples are engine-timed steps


@dataclass(frozen=True)
class StepSample:
    """One measured engine step (or the mean of many alike): its batch and its seconds."""

    decode_tokens: int  # decode tokens in the step (one per decoding sequence)
    prefill_tokens: int  # prompt tokens in the step
    revisions: int  # distinct adapter revisions in the step
    rank_tokens: int  # sum over the step's tokens of their adapter's rank
    step_s: float  # measured seconds
    # step_s also holds the front-to-engine hop (a lone request's TTFT less front_s)
    hop: bool = False
    byte_tokens: int = 0  # sum over the step's tokens of their adapter's bytes; 0: not known
    revision_widths: float = 0.0  # sum over its distinct revisions of bytes / rank

    def __post_init__(self) -> None:
        for name in ("decode_tokens", "prefill_tokens", "revisions", "rank_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"StepSample.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("byte_tokens", "revision_widths"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"StepSample.{name} must be >= 0, got {getattr(self, name)!r}")
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise ValueError(f"StepSample.step_s must be finite and > 0, got {self.step_s!r}")

    def row(self, weights: bool = False, timeline: bool = False) -> tuple[float, ...]:
        """The regressors: STEP_TERMS' in order, WEIGHT_TERMS' if ``weights``, then the hop,
        or with ``timeline`` the prefill-step indicator (the step holds prompt tokens)."""
        extra = (float(self.byte_tokens), self.revision_widths) if weights else ()
        last = self.prefill_tokens > 0 if timeline else self.hop
        return (
            1.0,
            float(self.decode_tokens),
            float(self.prefill_tokens),
            float(self.revisions),
            float(self.rank_tokens),
            *extra,
            float(last),
        )

    @property
    def timed_prefill(self) -> bool:
        """A prefill step timed on the engine's timeline (no hop in its seconds)."""
        return self.prefill_tokens > 0 and not self.hop


@dataclass(frozen=True)
class LoadSample:
    """One measured tier move of an adapter of known size."""

    link: str  # one of cost_model.LINKS
    nbytes: int  # the adapter's bytes
    seconds: float  # measured seconds of the move

    def __post_init__(self) -> None:
        if self.link not in LINKS:
            raise ValueError(f"LoadSample.link {self.link!r} is invalid; expected one of {LINKS}")
        if self.nbytes <= 0:
            raise ValueError(f"LoadSample.nbytes must be > 0, got {self.nbytes}")
        if not (self.seconds >= 0 and math.isfinite(self.seconds)):
            raise ValueError(f"LoadSample.seconds must be finite and >= 0, got {self.seconds!r}")


@dataclass(frozen=True)
class Fit:
    """A least-squares fit: the coefficients and how well they explain the samples."""

    coefficients: tuple[float, ...]  # one per regressor, >= 0
    r_squared: float | None  # 1 - SS_res / SS_tot; None when the samples do not vary
    max_rel_residual: float  # largest |measured - fitted| / measured over the samples


def least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> Fit:
    """Non-negative least squares by active set: fit every regressor; while a coefficient is
    negative, fix the most negative one at 0 and refit the others."""
    if len(rows) != len(ys) or not rows:
        raise ValueError(f"need as many rows as values, and some; got {len(rows)} / {len(ys)}")
    width = len(rows[0])
    active = list(range(width))
    while True:
        solved = _solve_normal([[row[i] for i in active] for row in rows], ys)
        if solved is None:
            raise ValueError(
                "the samples do not determine the fit: vary every regressor "
                f"({width} terms, {len(rows)} samples)"
            )
        worst = min(range(len(active)), key=lambda i: solved[i])
        if solved[worst] >= 0 or len(active) == 1:
            break
        active.pop(worst)
    coefficients = [0.0] * width
    for index, value in zip(active, solved, strict=True):
        coefficients[index] = max(0.0, value)
    return _quality(tuple(coefficients), rows, ys)


def _solve_normal(rows: list[list[float]], ys: Sequence[float]) -> list[float] | None:
    """Solves (XᵀX) b = Xᵀy by Gaussian elimination with partial pivoting (columns scaled to
    unit size first, so seconds and thousands of tokens stay well conditioned); None when
    singular."""
    width = len(rows[0])
    scale = [max((abs(r[j]) for r in rows), default=0.0) or 1.0 for j in range(width)]
    xs = [[r[j] / scale[j] for j in range(width)] for r in rows]
    a = [[sum(x[i] * x[j] for x in xs) for j in range(width)] for i in range(width)]
    b = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) for i in range(width)]
    for col in range(width):
        pivot = max(range(col, width), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12 * len(xs):  # columns are unit-scaled
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for r in range(col + 1, width):
            factor = a[r][col] / a[col][col]
            for c in range(col, width):
                a[r][c] -= factor * a[col][c]
            b[r] -= factor * b[col]
    out = [0.0] * width
    for r in reversed(range(width)):
        out[r] = (b[r] - sum(a[r][c] * out[c] for c in range(r + 1, width))) / a[r][r]
    return [out[j] / scale[j] for j in range(width)]


def _quality(
    coefficients: tuple[float, ...], rows: Sequence[Sequence[float]], ys: Sequence[float]
) -> Fit:
    fitted = [sum(c * x for c, x in zip(coefficients, row, strict=True)) for row in rows]
    mean = sum(ys) / len(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_res = sum((y - f) ** 2 for y, f in zip(ys, fitted, strict=True))
    worst = max((abs(y - f) / y for y, f in zip(ys, fitted, strict=True) if y > 0), default=0.0)
    r2 = None if ss_tot == 0 else 1 - ss_res / ss_tot
    return Fit(coefficients, r2, worst)


@dataclass(frozen=True)
class StepFit:
    """The fitted step model and the hop fitted with it."""

    step: StepCost  # every term fitted, per_prefill_token_s included
    # the front-to-engine hop (the TTFT-based prefill samples' last regressor); None: the
    # prefill samples were engine-timed steps, the hop is not in them (``median_hop_s``)
    ipc_s: float | None
    fit: Fit  # coefficients in STEP_TERMS order, WEIGHT_TERMS', then the hop or prefill step


def fit_step(samples: Sequence[StepSample]) -> StepFit:
    """The step-time model and ``ipc_s`` of ``samples``: decode mixes and lone-request prefills
    that vary every regressor independently, or the fit is refused (a step model without
    measured prompt tokens would price prefill by extrapolating decode). Samples with adapter
    bytes fit WEIGHT_TERMS too, and then need adapters of two or more bytes per rank. Prefill
    samples timed on the engine's timeline (``StepSample.timed_prefill``) fit
    ``per_prefill_step_s`` in place of the hop; they and TTFT-based ones are not mixed."""
    weights = any(s.byte_tokens for s in samples)
    timeline = any(s.timed_prefill for s in samples)
    if timeline and any(s.hop for s in samples):
        raise ValueError(
            "fit_step takes engine-timed prefill steps or TTFT-based prefill samples (hop), "
            "not both: a per-prefill-step term and the hop are the same column in the latter"
        )
    terms = (
        STEP_TERMS + (WEIGHT_TERMS if weights else ()) + ((PREFILL_STEP_TERM,) if timeline else ())
    )
    width = len(terms) + (0 if timeline else 1)
    if len(samples) < width:
        raise ValueError(f"fit_step needs >= {width} samples, got {len(samples)}")
    widths = {round(s.revision_widths / s.revisions, 6) for s in samples if s.revisions}
    for kind, present in (
        ("decode", any(s.decode_tokens for s in samples)),
        (
            "prefill (prompt tokens with the hop, or engine-timed)",
            any(s.prefill_tokens for s in samples),
        ),
        ("adapters of two or more target sets (bytes per rank)", not weights or len(widths) > 1),
    ):
        if not present:
            raise ValueError(f"fit_step needs {kind} samples: every term must be measured")
    rows = [s.row(weights, timeline) for s in samples]
    fit = least_squares(rows, [s.step_s for s in samples])
    step = StepCost(**dict(zip(terms, fit.coefficients, strict=False)))
    return StepFit(step, None if timeline else fit.coefficients[-1], fit)


def fit_link(samples: Sequence[LoadSample]) -> tuple[Link, Fit]:
    """One link's fixed seconds and bandwidth from moves of at least two distinct sizes.
    NOTE: a slope fitted at 0 (size made no measurable difference) would be an infinite
    bandwidth; the bandwidth is then the bound the samples support, the largest size over
    the fastest move."""
    links = {s.link for s in samples}
    if len(links) != 1:
        raise ValueError(f"fit_link takes samples of one link, got {sorted(links)}")
    if len({s.nbytes for s in samples}) < 2:
        raise ValueError(f"fit_link needs >= 2 distinct sizes on {links.pop()}")
    fit = least_squares([(1.0, float(s.nbytes)) for s in samples], [s.seconds for s in samples])
    fixed_s, per_byte_s = fit.coefficients
    if per_byte_s > 0:
        return Link(fixed_s=fixed_s, bytes_per_s=1.0 / per_byte_s), fit
    fastest = min(s.seconds for s in samples) or 1e-9
    return Link(fixed_s=fixed_s, bytes_per_s=max(s.nbytes for s in samples) / fastest), fit


JITTER_POINTS = 21  # quantiles kept of the hop's spread: every 5 %


def jitter_quantiles(residuals: Sequence[float], points: int = JITTER_POINTS) -> tuple[float, ...]:
    """``points`` quantiles (at probabilities 0, 1/(points-1), .., 1; linear between order
    statistics) of ``residuals``: each lone warm request's TTFT less its group's median (the
    cost model's ``hop_jitter_s``). Fewer than two residuals are refused: no spread is measured."""
    values = sorted(residuals)
    if len(values) < 2 or points < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError(
            f"residuals ({len(values)}) are invalid; expected >= 2 finite values and points >= 2"
        )
    out = []
    for i in range(points):
        at = i * (len(values) - 1) / (points - 1)
        low = min(int(at), len(values) - 2)
        out.append(values[low] + (at - low) * (values[low + 1] - values[low]))
    return tuple(out)


def median_hop_s(lone: Sequence[tuple[StepSample, float]], step: StepCost) -> float:
    """``ipc_s`` as the median over every lone warm request (its prefill sample, its TTFT less
    front_s) of what its TTFT leaves beyond ``step``'s price of its sample's shape, floored at 0.

    Why not the fit's hop coefficient: that is the least-squares intercept of the samples'
    medians (8 requests each), so a disturbance that slows a few samples' requests moves it
    whole, where it moves a median only by the share of requests slowed: one calibration
    (docs/simulator.md, SIMWARM's V9) had 7 of its 16 samples 6-20 ms late on the client's
    side, and its fitted hop came out 4.7 ms above this median."""
    if not lone:
        raise ValueError("lone is empty; expected at least one lone warm request")
    return max(0.0, statistics.median(ttft_s - _price(step, sample) for sample, ttft_s in lone))


def _price(step: StepCost, sample: StepSample) -> float:
    return step.seconds(
        sample.decode_tokens,
        sample.prefill_tokens,
        sample.revisions,
        sample.rank_tokens,
        byte_tokens=sample.byte_tokens,
        revision_widths=sample.revision_widths,
    )


def calibrated_model(
    hardware: str,
    steps: Sequence[StepSample],
    loads: Sequence[LoadSample],
    overheads: dict[str, float],
    sources: dict[str, str],
    *,
    load_cpu_shared: bool = False,
    load_handoff_s: float = 0.0,
    copy_handoff_s: float = 0.0,
    hop_jitter_s: tuple[float, ...] = (),
    lease_handoff_s: dict[str, float] | None = None,
    lone_hops: Sequence[tuple[StepSample, float]] = (),
) -> CostModel:
    """A validated cost model from measurements; ``overheads`` holds front_s and network_s
    (each optional, 0 when not measured, and said so in ``sources``); ``ipc_s`` is fitted with
    the step (``fit_step``) unless ``lone_hops`` are given; ``load_cpu_shared`` says whether
    the measured server's loader and engine share its CPU; ``load_handoff_s``, a cold request's
    measured wait beyond its load's stage seconds, is added to the L3 -> L2 link's fixed
    seconds (where a cold load starts);
    ``copy_handoff_s``, the same wait of a request whose adapter is only in L1, to the L1 -> L0
    link's (so a load from L3 pays it too: ``load_handoff_s`` is what L3 adds beyond it);
    ``hop_jitter_s``: the hop's spread (``jitter_quantiles``), () when not measured;
    ``lease_handoff_s``: a waiting lease's hand-off per source tier (``cost_model``), None or
    {} when not measured; ``lone_hops``: every lone warm request (its sample, its TTFT less
    front_s), whose ``median_hop_s`` replaces the fitted ``ipc_s``; (): the fitted one, which
    engine-timed prefill steps do not give (they hold no hop): with them ``lone_hops`` is
    required."""
    for name, value in (("load_handoff_s", load_handoff_s), ("copy_handoff_s", copy_handoff_s)):
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} {value!r} is invalid; expected finite >= 0")
    unknown = sorted(set(overheads) - {"front_s", "network_s"})
    if unknown:
        raise ValueError(
            f"overheads has unknown keys {unknown}; expected front_s, network_s "
            "(ipc_s is fitted with the step)"
        )
    fitted = fit_step(steps)
    if fitted.ipc_s is None and not lone_hops:
        raise ValueError(
            "lone_hops is empty; expected the lone warm requests' TTFTs: engine-timed prefill "
            "steps hold no hop, so ipc_s is their median beyond the fitted step"
        )
    links = {}
    for name in LINKS:
        mine = [s for s in loads if s.link == name]
        if not mine:
            raise ValueError(f"no load samples for link {name}: every link must be measured")
        links[name], _ = fit_link(mine)
    first = links["L3_to_L2"]
    links["L3_to_L2"] = Link(first.fixed_s + load_handoff_s, first.bytes_per_s)
    copy = links["L1_to_L0"]
    links["L1_to_L0"] = Link(copy.fixed_s + copy_handoff_s, copy.bytes_per_s)
    return CostModel(
        hardware=hardware,
        validated=True,
        step=fitted.step,
        links=links,
        ipc_s=median_hop_s(lone_hops, fitted.step) if lone_hops else (fitted.ipc_s or 0.0),
        sources=dict(sources),
        load_cpu_shared=load_cpu_shared,
        hop_jitter_s=hop_jitter_s,
        front_s=overheads.get("front_s", 0.0),
        network_s=overheads.get("network_s", 0.0),
        lease_handoff_s=dict(lease_handoff_s or {}),
    )


FIRST_SIZE_RATIO = 2.0  # a later cold request is "of a comparable size" within this factor


@dataclass(frozen=True)
class FirstSample:
    """One lone cold request (its adapter only in L3) on the engine's timeline."""

    adapter: str  # tenant/name@revision
    nbytes: int  # the adapter's bytes as served
    load_s: float  # its load's stage seconds summed (``engine.load_s``)
    step_s: float  # its first step, planned to ended
    hop_s: float  # its TTFT outside the engine (``ttft_s`` less ``first_step_end_s``)

    def __post_init__(self) -> None:
        if self.nbytes <= 0:
            raise ValueError(f"FirstSample.nbytes must be > 0, got {self.nbytes}")
        for name in ("load_s", "step_s", "hop_s"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"FirstSample.{name} must be finite, got {value!r}")


@dataclass(frozen=True)
class FirstFit:
    """A fresh server's one-time seconds (``cost_model.FIRST_KEYS``) and what they came from."""

    seconds: dict[str, float]  # first_load_s, first_step_s, first_hop_s: each >= 0
    first: FirstSample | None  # the server's first request; None: not measured
    later: tuple[FirstSample, ...]  # the later lone cold requests of a comparable size
    reason: str  # why the seconds are 0 ("" when measured)
    # the server's first L3 -> L2 load and the later ones of a comparable size, when loads came
    # before its first request (``with_first_load``); (): first_load_s is the request's
    loads: tuple[LoadSample, ...] = ()


def fit_first(
    first: FirstSample | None,
    later: Sequence[FirstSample],
    reason: str = "",
    size_ratio: float = FIRST_SIZE_RATIO,
) -> FirstFit:
    """What a fresh server's first request (``first``, a lone cold one) pays in each stage
    beyond the median of ``later`` lone cold requests whose adapter is within ``size_ratio`` of
    its size, floored at 0: ``first_load_s`` (load stage seconds), ``first_step_s`` (its first
    step) and ``first_hop_s`` (its TTFT outside the engine). Without ``first`` (``reason`` says
    why) or without a comparable later request, every key is 0 and the fit says why."""
    zero = {"first_load_s": 0.0, "first_step_s": 0.0, "first_hop_s": 0.0}
    if not (size_ratio >= 1 and math.isfinite(size_ratio)):
        raise ValueError(f"size_ratio {size_ratio!r} is invalid; expected finite >= 1")
    if first is None:
        return FirstFit(zero, None, (), reason or "no first request was given")
    alike = tuple(s for s in later if 1 / size_ratio <= s.nbytes / first.nbytes <= size_ratio)
    if not alike:
        why = (
            f"no later lone cold request of an adapter within {size_ratio:g}x of the first's "
            f"{first.nbytes} bytes ({len(later)} later lone cold requests)"
        )
        return FirstFit(zero, first, (), why)
    seconds = {
        f"first_{stage}_s": max(
            0.0,
            getattr(first, f"{stage}_s")
            - statistics.median(getattr(s, f"{stage}_s") for s in alike),
        )
        for stage in ("load", "step", "hop")
    }
    return FirstFit(seconds, first, alike, "")


def with_first_load(
    fit: FirstFit, loads: Sequence[LoadSample], size_ratio: float = FIRST_SIZE_RATIO
) -> FirstFit:
    """``fit`` with ``first_load_s`` from the server's own first load when load samples (in the
    order timed) came before its first request (``sim calibrate`` times one load per adapter
    before any request, so that request's load is not the process's first): the first
    L3 -> L2 sample less the median of the later ones within ``size_ratio`` of its bytes,
    floored at 0. Unchanged without a measured first request or a comparable later load."""
    stores = [s for s in loads if s.link == "L3_to_L2"]
    if fit.first is None or fit.reason or not stores:
        return fit
    head = stores[0]
    alike = [s for s in stores[1:] if 1 / size_ratio <= s.nbytes / head.nbytes <= size_ratio]
    if not alike:
        return fit
    excess = max(0.0, head.seconds - statistics.median(s.seconds for s in alike))
    return replace(fit, seconds={**fit.seconds, "first_load_s": excess}, loads=(head, *alike))


@dataclass(frozen=True)
class HopSample:
    """One request of a server's request log: its time outside the engine and whether another
    request was in flight on the server at its arrival (``CostModel.hop_busy_s``)."""

    outside_s: float  # ttft_s less first_step_end_s: the way in and the first token's way out
    busy: bool  # another request had arrived and not ended when it arrived

    def __post_init__(self) -> None:
        if not math.isfinite(self.outside_s):
            raise ValueError(f"HopSample.outside_s must be finite, got {self.outside_s!r}")


@dataclass(frozen=True)
class HopBusyFit:
    """``hop_busy_s`` and the medians it is the difference of (None: not measured)."""

    seconds: float  # >= 0; 0 when not measured
    busy_median_s: float | None  # the median outside time of the requests that arrived busy
    lone_median_s: float | None  # ... of those that arrived alone
    busy: int  # samples that arrived busy
    lone: int  # samples that arrived alone


def fit_hop_busy(samples: Sequence[HopSample]) -> HopBusyFit:
    """The median time outside the engine of ``samples`` that arrived while another request was
    in flight less that of those that arrived alone, floored at 0; 0 (medians None) without a
    sample of either kind."""
    busy = [s.outside_s for s in samples if s.busy]
    lone = [s.outside_s for s in samples if not s.busy]
    if not busy or not lone:
        return HopBusyFit(0.0, None, None, len(busy), len(lone))
    b, a = statistics.median(busy), statistics.median(lone)
    return HopBusyFit(max(0.0, b - a), b, a, len(busy), len(lone))
