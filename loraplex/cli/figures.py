"""Figures of a JSON record read as text, for the CLI's human summaries (``plan``, ``sim run``):
the records' nested dicts printed as Python dicts read poorly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def figure(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``; ``-`` where the record has none."""
    return "-" if value is None else format(value, spec)


def ttft_text(ttft_ms: Mapping[str, Any], label: str = "ttft") -> str:
    """``ttft p50 24.7 p99 92.5 ms (n 226)``."""
    figures = " ".join(f"{name} {figure(ttft_ms.get(name), '.1f')}" for name in ("p50", "p99"))
    return f"{label} {figures} ms (n {ttft_ms.get('n', 0)})"


def named_figures(values: Mapping[str, float | None], spec: str = "g") -> str:
    """``L0 0.75, L1 0.25``: each name with its figure, in the record's order."""
    return ", ".join(f"{name} {figure(value, spec)}" for name, value in values.items())
