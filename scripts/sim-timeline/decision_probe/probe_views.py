"""A replica as the router saw it at one ``Router.choose``: the probe (``sitecustomize.py``)
logs it for the real run, ``fleet_decisions.py`` for its simulations, so both sides compare
the same fields computed the same way. Imports nothing from loraplex: the probe is loaded into
every process started with this directory on ``PYTHONPATH``."""

from __future__ import annotations

from typing import Any


def tier(report: Any, key: str | None) -> str | None:
    """The tier ``report`` shows ``key`` in ("absent": none); None without a report or key."""
    if report is None or key is None:
        return None
    for name in ("l0", "loading", "l1", "l2"):
        if key in getattr(report.residency, name):
            return name
    return "absent"


def replica_view(report: Any, key: str | None, now_s: float) -> dict[str, Any]:
    """The report's age at ``now_s``, ``key``'s tier there and the replica's load figures."""
    load = None if report is None else report.load
    return {
        "age_s": None if report is None else round(now_s - report.at_s, 4),
        "tier": tier(report, key),
        "queued": None if load is None else load.num_queued,
        "adapter_wait": None if load is None else load.num_adapter_wait,
        "running": None if load is None else load.num_running,
        "evictions_per_min": None if load is None else round(load.evictions_per_min, 3),
    }
