"""``loraplex bench fleet``'s human table: per trace, one row per policy (medians over the
repeats, the headline figures with their [min-max]), the headline ratios with theirs, and each
policy's decisions by reason. Printed before the JSON line unless ``--json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loraplex.bench.fleet.repeats import Spread
from loraplex.bench.fleet.report import HEADLINES


def _cell(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _ranged(value: object, spread: Spread | None) -> str:
    """``median [min-max]``, or the value alone without a spread."""
    if spread is None:
        return _cell(value)
    return f"{_cell(value)} [{_cell(spread[0])}-{_cell(spread[1])}]"


_COLUMNS = (
    ("policy", 26),
    ("L0 hit [min-max]", 24),
    ("p50 ms", 9),
    ("p99 ms [min-max]", 28),
    ("done", 7),
    ("cold/1k", 8),
    ("imbal.", 7),
)


def _row(cells: Sequence[str]) -> str:
    """The first cell left-aligned, the others right-aligned, in ``_COLUMNS``' widths."""
    widths = [w for _, w in _COLUMNS]
    first = f"{cells[0]:<{widths[0]}}"
    return " ".join([first, *(f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))])


def _policy_row(policy: str, s: Mapping[str, Any]) -> str:
    spread = s["spread"]
    cells = (
        policy,
        _ranged(s["l0_hit_ratio"], spread["l0_hit_ratio"]),
        _cell(s["ttft_ms"]["p50"]),
        _ranged(s["ttft_ms"]["p99"], spread["ttft_ms"]["p99"]),
        _cell(s["completed_ratio"]),
        _cell(s["cold_loads_per_1k_requests"]),
        _cell(s["imbalance"]),
    )
    return "  " + _row(cells)


def fleet_table(result: Mapping[str, Any]) -> str:
    """The human summary: per trace, one row per policy (medians over the repeats, with the
    spread of the headline figures), the headline ratios with theirs, and each policy's
    decisions by reason."""
    lines = []
    metrics = result["metrics"]
    for trace in result["config"]["traces"]:
        m = metrics[trace]
        lines.append(f"{trace}:")
        lines.append("  " + _row([name for name, _ in _COLUMNS]))
        lines += [_policy_row(policy, s) for policy, s in m["policies"].items()]
        for h in HEADLINES:
            value = _ranged(m[h.name], m["spread"][h.name])
            lines.append(f"  {h.name:<32} {value:>22}   (issue's target {h.target})")
        for policy, s in m["policies"].items():
            reasons = ", ".join(f"{k} {v}" for k, v in s["decisions"].items()) or "none"
            lines.append(f"  decisions {policy}: {reasons}")
    extra = {k: v for k, v in metrics.items() if k not in result["config"]["traces"]}
    lines += [f"{k}: {_cell(v)}" for k, v in extra.items()]
    return "\n".join(lines)
