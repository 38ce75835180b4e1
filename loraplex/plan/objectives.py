"""Service objectives the planner must meet, parsed from ``--slo`` text.

Grammar: comma-separated ``METRIC OP VALUE``, OP ``<=`` or ``>=``. Metrics (what the simulator's
result metrics report, ``sim/result.py``):

    ttft_p50, ttft_p99   milliseconds; VALUE may end in ``ms`` or ``s``
    completed_ratio      0..1
    throughput_requests_per_s   completed requests per second
    hit_ratio_L0         share of acquires served from a GPU slot

e.g. ``ttft_p99<=500ms,completed_ratio>=0.99``. Anything else is a ValueError naming it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

METRICS = (
    "ttft_p50",
    "ttft_p99",
    "completed_ratio",
    "throughput_requests_per_s",
    "hit_ratio_L0",
)
_TIME_METRICS = ("ttft_p50", "ttft_p99")
_RATIO_METRICS = ("completed_ratio", "hit_ratio_L0")
_TERM = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=)\s*([0-9.eE+-]+)\s*(ms|s)?\s*$")


@dataclass(frozen=True)
class Objective:
    """One bound on one outcome metric."""

    metric: str  # one of METRICS
    op: str  # "<=" or ">="
    bound: float  # in the metric's unit (ms for TTFT)

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"objective metric {self.metric!r} is unknown; expected {METRICS}")
        if self.op not in ("<=", ">="):
            raise ValueError(f"objective operator {self.op!r} is invalid; expected <= or >=")
        if not math.isfinite(self.bound) or self.bound < 0:
            raise ValueError(f"objective bound {self.bound!r} must be finite and >= 0")

    def value(self, outcome: Mapping[str, Any]) -> float | None:
        """The metric in ``outcome``; None when the outcome leaves it undefined."""
        if self.metric in _TIME_METRICS:
            raw = outcome["ttft_ms"][self.metric.removeprefix("ttft_")]
        elif self.metric == "hit_ratio_L0":
            raw = outcome["hit_ratio"]["L0"]
        else:
            raw = outcome[self.metric]
        return None if raw is None else float(raw)

    def met_by(self, outcome: Mapping[str, Any]) -> bool:
        """An undefined value meets no objective (unknown is not good enough)."""
        value = self.value(outcome)
        if value is None:
            return False
        return value <= self.bound if self.op == "<=" else value >= self.bound

    def text(self) -> str:
        unit = "ms" if self.metric in _TIME_METRICS else ""
        return f"{self.metric}{self.op}{self.bound:g}{unit}"


def missed(objectives: Sequence[Objective], outcome: Mapping[str, Any]) -> list[str]:
    """The objectives ``outcome`` misses, as ``metric=value (wants ...)``."""
    out = []
    for objective in objectives:
        if not objective.met_by(outcome):
            value = objective.value(outcome)
            shown = "undefined" if value is None else f"{value:g}"
            out.append(f"{objective.metric}={shown} (wants {objective.text()})")
    return out


def parse_objectives(text: str) -> tuple[Objective, ...]:
    """``--slo`` text as objectives; an empty text or a malformed term is a ValueError."""
    terms = [t for t in text.split(",") if t.strip()]
    if not terms:
        raise ValueError("--slo names no objective; e.g. 'ttft_p99<=500ms'")
    out = []
    for term in terms:
        match = _TERM.match(term)
        if match is None:
            raise ValueError(f"--slo term {term.strip()!r} is malformed; expected METRIC<=VALUE")
        metric, op, number, unit = match.groups()
        if metric not in METRICS:  # NOTE: before the unit: ttft_p95<=500ms said "takes no unit"
            raise ValueError(
                f"--slo term {term.strip()!r}: metric {metric!r} is unknown; expected one of "
                f"{list(METRICS)}"
            )
        try:
            bound = float(number)
        except ValueError as exc:
            raise ValueError(f"--slo term {term.strip()!r}: {number!r} is no number") from exc
        if unit is not None and metric not in _TIME_METRICS:
            raise ValueError(f"--slo term {term.strip()!r}: {metric} takes no unit")
        if not math.isfinite(bound) or bound < 0:  # the Objective's own message named no flag
            raise ValueError(f"--slo term {term.strip()!r}: expected a finite bound >= 0")
        if unit == "s":
            bound *= 1000.0
        if metric in _RATIO_METRICS and bound > 1:  # NOTE: completed_ratio>=1.5 was accepted:
            # no run can meet it, and the plan said only that nothing met it
            raise ValueError(
                f"--slo term {term.strip()!r}: {metric} is a ratio; expected a bound from 0 to 1"
            )
        out.append(Objective(metric, op, bound))
    return tuple(out)
