"""A stored release as a view shows it (the admin API's answers, ``release status`` and ``release
list``, text and ``--json``): every value a view cannot carry made safe, and named.

A release is stored once and read back for as long as it is kept, by code newer than the code
that stored it. Bounds added since (``model.check_plan_bounds``, ``MAX_PLAN_SECONDS``) hold new
releases, not old rows: a release stored before them may hold a probe text with a lone surrogate
(UTF-8 cannot encode it), an infinite ``window_s`` (JSON cannot carry it) or a ``dwell_s`` of
``1e300`` (a ``hold_until`` no date can show). NOTE: such a row failed every view that held it:
the admin API's page of releases (a 400 naming the serializer's error, or a 500), and
``release status`` (``OverflowError`` from the date), so one old release hid every other on its
page. ``shown`` leaves the record alone and returns its view with each such value made safe (a
lone surrogate as U+FFFD; a number out of its bounds as null) and named in ``invalid``
(``path: why``), so the operator sees the release, its id and what is wrong with it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from loraplex.release.model import MAX_PLAN_SECONDS

# The last instant a date shows (9999-12-31T23:59:59Z; ``datetime`` has no year 10000).
MAX_SHOWN_EPOCH_S = 253_402_300_799.0
# A view's epoch seconds (the record's, and its comparison's ``at``), by their path.
_TIMES = frozenset(
    {"created_at", "updated_at", "step_started_at", "hold_until", "comparison.at", "live.since"}
)
# The plan's durations (``ReleasePlan.durations``), held to ``MAX_PLAN_SECONDS``.
_DURATIONS = frozenset({"plan.dwell_s", "plan.window_s", "plan.thresholds.max_step_s"})
_SURROGATE = re.compile("[\ud800-\udfff]")


def shown(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a release as a view shows it: ``asdict`` of the record, with what the view
    adds) with every value made safe to send and print, and ``invalid``: one ``path: why`` per
    value changed (empty for a release stored within today's bounds)."""
    invalid: list[str] = []
    safe = {key: _safe(value, key, invalid) for key, value in body.items()}
    safe["invalid"] = invalid
    return safe


def _safe(value: Any, path: str, invalid: list[str]) -> Any:
    if isinstance(value, dict):
        return {key: _safe(item, _join(path, str(key)), invalid) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(item, f"{path}[{index}]", invalid) for index, item in enumerate(value)]
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        invalid.append(f"{path}: lone surrogates (UTF-8 cannot encode them) shown as U+FFFD")
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, float):
        why = _number_error(value, path)
        if why is None:
            return value
        invalid.append(f"{path}: {value!r} {why}; shown as null")
        return None
    return value


def _number_error(value: float, path: str) -> str | None:
    if not math.isfinite(value):
        return "is not a finite number"
    if path in _DURATIONS and not 0.0 <= value <= MAX_PLAN_SECONDS:
        return f"is out of bounds (0 to {MAX_PLAN_SECONDS:.0f} s)"
    if path in _TIMES and not 0.0 <= value <= MAX_SHOWN_EPOCH_S:
        return "is no date"
    return None


def _join(path: str, key: str) -> str:
    return key if not path else f"{path}.{key}"
