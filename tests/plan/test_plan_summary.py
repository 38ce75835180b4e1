"""``loraplex plan``'s stderr summary reads as sentences: it printed each candidate's TTFT as
the Python dict of the JSON record (``ttft {'n': 226, 'p50': ...}``)."""

from __future__ import annotations

from typing import Any

from loraplex.cli.plan import summary


def _entry(label: str, ttft_ms: dict[str, Any], completed: float | None) -> dict[str, Any]:
    return {
        "config": {"label": label},
        "usd_per_correct_request": 1.46e-4,
        "violations": ["ttft_p99<=50ms"],
        "ttft_ms": ttft_ms,
        "completed_ratio": completed,
    }


def test_the_summary_gives_figures_not_a_dict() -> None:
    best = _entry("r=1 slots=2", {"n": 226, "p50": 24.728, "p90": 52.9, "p99": 92.494}, 1.0)
    rejected = _entry("r=1 slots=1", {"n": 0, "p50": None, "p90": None, "p99": None}, None)
    record = {
        "best": best,
        "runner_up": None,
        "why_runner_up_lost": "no runner-up",
        "cheapest_rejected": rejected,
    }
    lines = summary(record).splitlines()
    assert lines[0] == (
        "best: r=1 slots=2  0.000146 USD/correct request  ttft p50 24.7 p99 92.5 ms (n 226)  "
        "completed 1"
    )
    assert lines[1] == "runner-up: none"
    assert lines[3].endswith("ttft p50 - p99 - ms (n 0)  completed -")
    assert lines[4] == "  missed: ttft_p99<=50ms"
    assert "{" not in summary(record)


def test_no_feasible_configuration_is_said_once_with_the_objectives() -> None:
    """With nothing feasible it printed "best: none", "runner-up: none" and "why the
    runner-up lost: None" (seen planning an operator's own trace on its own cost model)."""
    rejected = _entry("r=1 slots=4", {"n": 2134, "p50": 141.5, "p90": 900.0, "p99": 5696.0}, 1.0)
    record = {
        "best": None,
        "runner_up": None,
        "why_runner_up_lost": None,
        "cheapest_rejected": rejected,
        "candidates": 16,
        "slo": ["ttft_p99<=500ms", "completed_ratio>=0.99"],
    }
    lines = summary(record).splitlines()
    assert lines[0] == (
        "best: none of the 16 configurations met ttft_p99<=500ms, completed_ratio>=0.99"
    )
    assert lines[1].startswith("cheapest rejected: r=1 slots=4  0.000146 USD/correct request")
    assert lines[2] == "  missed: ttft_p99<=50ms"
    assert "None" not in summary(record) and "runner-up" not in summary(record)
