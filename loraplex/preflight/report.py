"""What ``loraplex preflight`` reports: one verdict per launch item, with the evidence it used.

The fourteen items are the seeds' launch checklist (issue 31). Every item ends PASS, WARN or FAIL;
an item that cannot be judged from outside the deployment is a WARN naming why, never a PASS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Item:
    """One launch-checklist item."""

    item_id: str  # stable identifier, used in the JSON report and the docs
    title: str  # the checklist's wording, shortened


ITEMS: tuple[Item, ...] = (
    Item("immutable_digests", "every revision is an immutable content digest"),
    Item("validated_at_registration", "rank, dtype and target modules validated at registration"),
    Item("cache_limits_load_tested", "max_loras / CPU / rank limits load-tested on the real mix"),
    Item("tiers_distinguished", "GPU, CPU, disk hits and remote misses told apart"),
    Item("no_eviction_in_use", "an adapter with requests in flight is never evicted"),
    Item("core_warm_policy", "core adapters have a warm or pin policy"),
    Item("tenant_pollution_bounded", "no tenant can fill the cache without bound"),
    Item("router_affinity_and_load", "the router weighs adapter affinity and load"),
    Item("cache_keys_base_and_revision", "cache keys carry the base model and the revision"),
    Item("canary_prewarm_rollback", "canary, pre-warming and rollback available"),
    Item("load_unload_not_exposed", "dynamic load/unload refused to ordinary callers"),
    Item("cold_warm_ttft_separate", "cold and warm TTFT monitored separately"),
    Item("eviction_alerted", "eviction and reload-after-eviction alerted"),
    Item("hot_and_long_tail_load", "load test with hot adapters plus a long-tail burst"),
)
ITEM_IDS = tuple(item.item_id for item in ITEMS)


@dataclass(frozen=True)
class Verdict:
    """An item's outcome."""

    item_id: str  # one of ``ITEM_IDS``
    status: Status  # PASS / WARN / FAIL
    summary: str  # one sentence: why this status
    evidence: tuple[str, ...] = ()  # the requests, metric values and registry answers used

    def __post_init__(self) -> None:
        if self.item_id not in ITEM_IDS:
            raise ValueError(f"item_id {self.item_id!r} is invalid; expected one of {ITEM_IDS}")


@dataclass(frozen=True)
class Report:
    """Every item's verdict, in checklist order, plus the deployment it was taken from."""

    url: str  # the deployment checked
    verdicts: tuple[Verdict, ...]  # one per item of ``ITEMS``
    facts: dict[str, Any] = field(default_factory=dict)  # load test figures, replicas, ...

    def __post_init__(self) -> None:
        found = tuple(v.item_id for v in self.verdicts)
        if found != ITEM_IDS:
            raise ValueError(f"verdicts {found} are invalid; expected one per item {ITEM_IDS}")

    def verdict(self, item_id: str) -> Verdict:
        return next(v for v in self.verdicts if v.item_id == item_id)

    def counts(self) -> dict[str, int]:
        return {s.value: sum(v.status is s for v in self.verdicts) for s in Status}

    def exit_code(self) -> int:
        """1 when any item FAILed, else 0."""
        return int(any(v.status is Status.FAIL for v in self.verdicts))

    def to_json(self) -> dict[str, Any]:
        titles = {item.item_id: item.title for item in ITEMS}
        return {
            "url": self.url,
            "ok": self.exit_code() == 0,
            "counts": self.counts(),
            "items": [
                {
                    "item": v.item_id,
                    "title": titles[v.item_id],
                    "status": v.status.value,
                    "summary": v.summary,
                    "evidence": list(v.evidence),
                }
                for v in self.verdicts
            ],
            "facts": self.facts,
        }

    def json_line(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    def text(self) -> str:
        """The human-readable report: one line per item, its evidence indented below."""
        lines: list[str] = []
        for number, verdict in enumerate(self.verdicts, start=1):
            lines.append(
                f"{number:2d}. {verdict.status.value:4s} {verdict.item_id}: {verdict.summary}"
            )
            lines.extend(f"      - {line}" for line in verdict.evidence)
        counts = self.counts()
        lines.append(
            f"preflight {self.url}: {counts['PASS']} passed, {counts['WARN']} warned, "
            f"{counts['FAIL']} failed"
        )
        return "\n".join(lines)
