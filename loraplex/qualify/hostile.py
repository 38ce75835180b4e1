"""The hostile tenant that runs beside every cell: it asks for the victims' private adapters
(each must be indistinguishable from a nonexistent one), reads the listings (no foreign adapter
may appear), and fires a cold-load storm over its own adapters (eviction pressure). A breach is
any foreign effect it could see; the victims' side of the bound is judged in ``checks.py``."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from loraplex.qualify.client import Admin, stream_completion

NONEXISTENT = "qualify-no-such-adapter"  # an adapter name no tenant registers


@dataclass
class HostileReport:
    """What the hostile tenant did in one cell and which foreign effects it saw."""

    breaches: list[str] = field(default_factory=list)  # each foreign effect, as evidence
    probes: int = 0  # foreign-adapter and listing probes sent
    storm_sent: int = 0  # cold-load storm requests sent
    storm_answered: int = 0  # of those, answered 200


def _shape(status: int, body: Any) -> tuple[int, str, str]:
    """What a refusal may show: status, error type and code (messages name the model asked)."""
    error = body.get("error", {}) if isinstance(body, dict) else {}
    if not isinstance(error, dict):
        error = {}
    return status, str(error.get("type")), str(error.get("code"))


def probe_foreign(admin: Admin, key: str, victim_aliases: list[str], report: HostileReport) -> None:
    """Each victim alias, asked by the hostile tenant, must answer exactly as a nonexistent
    adapter of the same tenant does; ``/v1/models`` must list none of the victims' adapters."""
    victims = {alias.partition("/")[0] for alias in victim_aliases}
    for alias in victim_aliases:
        tenant = alias.partition("/")[0]
        asked = _complete(admin, key, alias)
        missing = _complete(admin, key, f"{tenant}/{NONEXISTENT}")
        report.probes += 2
        if asked[0] == 200 or _shape(*asked) != _shape(*missing):
            report.breaches.append(
                f"hostile asked {alias}: {asked[0]} {json.dumps(asked[1])[:160]} "
                f"(a nonexistent adapter: {missing[0]})"
            )
    listing = admin.call("GET", "/v1/models", key)
    report.probes += 1
    rows = listing.body.get("data", []) if isinstance(listing.body, dict) else []
    seen = sorted(str(row.get("root")) for row in rows if row.get("owned_by") in victims)
    if seen:
        report.breaches.append(f"hostile's /v1/models lists foreign adapters {seen[:5]}")


def _complete(admin: Admin, key: str, model: str) -> tuple[int, Any]:
    body = {"model": model, "prompt": "hello", "max_tokens": 1, "temperature": 0}
    reply = admin.call("POST", "/v1/completions", key, json=body)
    return reply.status, reply.body


async def storm(
    url: str, key: str, aliases: list[str], *, requests: int, timeout_s: float,
    report: HostileReport,
) -> None:  # fmt: skip
    """``requests`` completions spread over the hostile tenant's own adapters, all at once."""
    if not aliases or requests < 1:
        return
    bodies = [
        {"model": aliases[i % len(aliases)], "prompt": "storm", "max_tokens": 4, "temperature": 0}
        for i in range(requests)
    ]
    answers = await asyncio.gather(*(stream_completion(url, key, b, timeout_s) for b in bodies))
    report.storm_sent += len(answers)
    report.storm_answered += sum(1 for a in answers if a.status == 200)
