"""What ``loraplex release start`` parses from its options: shares, durations, the canary ladder
and the probe file. Each refuses bad input with a ``ValueError`` naming the flag."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from loraplex.release.model import (
    MAX_LADDER_STEPS,
    MAX_PLAN_SECONDS,
    MAX_PROBES,
    ProbeCase,
    ReleasePlan,
    probe_bounds_error,
)


def parse_share(flag: str, text: str) -> float:
    """``5%`` or ``0.05``."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{flag} {text!r} is invalid; expected a share like 5% or 0.05 in (0, 1]")
    return value


def parse_duration(flag: str, text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` -> seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    raw = text.strip()
    scale = units.get(raw[-1:], 1.0)
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        seconds = float(number) * scale
    except ValueError:
        seconds = float("nan")
    if not 0.0 <= seconds <= MAX_PLAN_SECONDS:
        raise ValueError(
            f"{flag} {text!r} is invalid; expected a duration like 60s, 10m or 1h, at most "
            "30 days (720h)"
        )
    return seconds


def parse_ladder(share: str | None, ladder: str | None) -> tuple[float, ...]:
    if share is not None and ladder is not None:
        raise ValueError(
            "--share and --ladder are both given; expected one (--share X = --ladder X)"
        )
    if share is not None:
        return (parse_share("--share", share),)
    if ladder is None:
        return ReleasePlan().ladder
    parts = ladder.split(",")
    if len(parts) > MAX_LADDER_STEPS:
        raise ValueError(
            f"--ladder of {len(parts)} steps is invalid; expected at most {MAX_LADDER_STEPS}"
        )
    steps = tuple(parse_share("--ladder", part) for part in parts)
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError(f"--ladder {ladder!r} is invalid; expected strictly increasing shares")
    return steps


def read_probes(path: Path) -> tuple[ProbeCase, ...]:
    """One JSON object per line: ``prompt`` and ``expected`` and/or ``differ_from_stable``,
    optional ``max_tokens``. Unknown keys, a value of the wrong type or over its bound, and more
    than ``MAX_PROBES`` probes are refused, naming the line (read no further than that)."""
    known = {"prompt", "expected", "differ_from_stable", "max_tokens"}
    cases = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                cases.append(_probe_line(f"--probe-file {path} line {number}", line, known))
            if len(cases) > MAX_PROBES:
                raise ValueError(
                    f"--probe-file {path} line {number} is probe {len(cases)}; expected at "
                    f"most {MAX_PROBES} probes"
                )
    return tuple(cases)


def _probe_line(where: str, line: str, known: set[str]) -> ProbeCase:
    """One line of the probe file as a probe (``where`` names it in every error)."""
    try:
        raw: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not JSON: {exc.msg}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is invalid; expected a JSON object")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where}: keys {unknown} are unknown; expected {sorted(known)}")
    try:
        case = ProbeCase(**raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
    error = probe_bounds_error(case)
    if error is not None:
        raise ValueError(f"{where}: {error}")
    return case
