"""The run's report: one JSON object (printed as one line) with per-cell metrics and the
headline ratios, and the exit code (0: every cell passed; 1: a cell failed)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from loraplex.bench.harness.stats import nearest_rank
from loraplex.qualify.baselines.types import MethodResult
from loraplex.qualify.checks import CellVerdict
from loraplex.qualify.compare import cost_ratio, median_or_none, spend_ratio
from loraplex.qualify.plan import QualifyPlan
from loraplex.qualify.traffic import CellRun

SCHEMA = "loraplex-qualify/1"
HEADLINE_ACTIVE = (256, 1024)  # where cost over separate deployments is the headline


@dataclass(frozen=True)
class CellReport:
    """One cell: what ran, its verdict and the three methods."""

    run: CellRun  # what was sent and seen
    verdict: CellVerdict  # the four checks
    loraplex: MethodResult  # the deployment under test, priced
    others: dict[str, MethodResult | dict[str, Any]]  # comparators: result or why none

    def to_json(self) -> dict[str, Any]:
        cell, verdict = self.run.cell, self.verdict
        methods = {"loraplex": asdict(self.loraplex)}
        methods.update(
            {k: asdict(v) if isinstance(v, MethodResult) else v for k, v in self.others.items()}
        )
        return {
            "cell_id": cell.cell_id, "active_adapters": cell.active_adapters,
            "rank_distribution": cell.rank_distribution, "token_shape": cell.shape.name,
            "prompt_tokens": self.run.prompt_tokens, "output_tokens": cell.shape.output_tokens,
            "popularity": cell.popularity, "passed": verdict.passed, "reasons": verdict.reasons,
            **{f"{k}_ratio": v for k, v in verdict.pass_ratios.items()},
            "availability_ratio": _fraction(verdict.answered, verdict.traffic_requests),
            "requests": verdict.traffic_requests, "answered": verdict.answered,
            "failures": verdict.failures, "retries": verdict.retries,
            "retried_requests": verdict.retried_requests,
            "correct_requests": verdict.correct_requests,
            "unverified_texts": verdict.unverified_texts, "quality_per_revision": verdict.quality,
            "undiscriminating_probes": verdict.undiscriminating_probes,
            **_ttft("warm", verdict.ttft_warm_s), **_ttft("cold", verdict.ttft_cold_s),
            "num_warm": len(verdict.ttft_warm_s), "num_cold": len(verdict.ttft_cold_s),
            "hostile": asdict(self.run.hostile), "wall_s": round(self.run.wall_s, 3),
            "methods": methods,
            "cost_per_correct_request_over_separate": self.ratio("separate"),
            "cost_per_correct_request_over_in_context": self.ratio("in_context"),
            "cost_per_request_over_in_context": self.spend("in_context"),
        }  # fmt: skip

    def ratio(self, method: str) -> float | None:
        other = self.others.get(method)
        return None if other is None else cost_ratio(self.loraplex, other)

    def spend(self, method: str) -> float | None:
        other = self.others.get(method)
        return None if other is None else spend_ratio(self.loraplex, other)


@dataclass(frozen=True)
class QualifyReport:
    """The whole run."""

    payload: dict[str, Any]  # the JSON object
    cells: list[CellReport]  # for the HTML report

    def json_line(self) -> str:
        return json.dumps(self.payload, separators=(",", ":"), sort_keys=False)

    def exit_code(self) -> int:
        return 0 if self.payload["passed"] else 1


def build_report(
    plan: QualifyPlan, url: str, reports: list[CellReport], retired_failed: list[str],
    wall_s: float,
) -> QualifyReport:  # fmt: skip
    cells = [r.to_json() for r in reports]
    failed = [c["cell_id"] for c in cells if not c["passed"]]
    payload = {
        "name": "qualify", "schema": SCHEMA, "url": url, "plan": asdict(plan),
        "num_cells": len(cells), "failed_cells": failed,
        "passed": not failed and not retired_failed, "retire_failures": retired_failed,
        "headline": headline(reports), "wall_s": round(wall_s, 3), "cells": cells,
    }  # fmt: skip
    return QualifyReport(payload, reports)


def headline(reports: list[CellReport]) -> dict[str, Any]:
    """Medians over cells of the per-cell cost ratios (null where no cell defines one)."""
    out: dict[str, Any] = {}
    for active in HEADLINE_ACTIVE:
        ratios = [r.ratio("separate") for r in reports if r.run.cell.active_adapters == active]
        out[f"cost_per_correct_request_over_separate_at_{active}"] = median_or_none(ratios)
    out["cost_per_correct_request_over_in_context"] = median_or_none(
        [r.ratio("in_context") for r in reports]
    )
    out["cost_per_request_over_in_context"] = median_or_none(
        [r.spend("in_context") for r in reports]
    )
    out["quality_ratio_loraplex"] = median_or_none(
        [r.verdict.pass_ratios["quality"] for r in reports]
    )
    in_context = [r.others.get("in_context") for r in reports]
    out["quality_ratio_in_context"] = median_or_none(
        [m.pass_ratios.get("quality") for m in in_context if isinstance(m, MethodResult)]
    )
    out["correct_revision_ratio_min"] = _min(
        [r.verdict.pass_ratios["correct_revision"] for r in reports]
    )
    out["isolation_ratio_min"] = _min([r.verdict.pass_ratios["isolation"] for r in reports])
    out["availability_ratio_min"] = _min(
        [_fraction(r.verdict.answered, r.verdict.traffic_requests) for r in reports]
    )
    out["retries"] = sum(r.verdict.retries for r in reports)
    out["undiscriminating_probes"] = sum(r.verdict.undiscriminating_probes for r in reports)
    return out


def _fraction(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


def _min(values: list[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return min(defined) if defined else None


def _p(values: list[float], q: float) -> float | None:
    value = nearest_rank(values, q)
    return None if value is None else round(value, 4)


def _ttft(kind: str, values: list[float]) -> dict[str, float | None]:
    return {f"ttft_{kind}_p50_s": _p(values, 0.5), f"ttft_{kind}_p99_s": _p(values, 0.99)}
