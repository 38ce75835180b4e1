"""Rows of the ``releases`` table <-> ``Release`` records (plan and comparison as JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from loraplex.registry.sql import paging
from loraplex.registry.sql.db import Row, Tx
from loraplex.registry.sql.paging import Page, unknown_cursor
from loraplex.release.model import (
    TERMINAL_STATES,
    Comparison,
    ProbeCase,
    Release,
    ReleasePlan,
    ReleaseState,
    RevisionWindow,
    Thresholds,
)

COLUMNS = (
    "release_id, tenant, name, candidate, baseline, state, step, plan, created_at, updated_at, "
    "step_started_at, reason, actor, hold_until, version, comparison, active, canary_share"
)
_PLACEHOLDERS = ", ".join("?" for _ in COLUMNS.split(","))


def plan_to_json(plan: ReleasePlan) -> str:
    return json.dumps(asdict(plan), sort_keys=True)


def plan_from_json(text: str) -> ReleasePlan:
    raw: dict[str, Any] = json.loads(text)
    return ReleasePlan(
        ladder=tuple(float(share) for share in raw["ladder"]),
        dwell_s=float(raw["dwell_s"]),
        window_s=float(raw["window_s"]),
        gpu=bool(raw["gpu"]),
        auto_promote=bool(raw["auto_promote"]),
        thresholds=Thresholds(**raw["thresholds"]),
        probes=tuple(ProbeCase(**probe) for probe in raw["probes"]),
    )


def comparison_to_json(comparison: Comparison | None) -> str | None:
    return None if comparison is None else json.dumps(asdict(comparison), sort_keys=True)


def comparison_from_json(text: str | None) -> Comparison | None:
    if text is None:
        return None
    raw: dict[str, Any] = json.loads(text)
    return Comparison(
        step=int(raw["step"]),
        at=float(raw["at"]),
        candidate=RevisionWindow(**raw["candidate"]),
        stable=RevisionWindow(**raw["stable"]),
        breaches=tuple(str(b) for b in raw["breaches"]),
        passed=bool(raw["passed"]),
    )


def _values(release: Release) -> tuple[object, ...]:
    """The row; ``active`` and ``canary_share`` are derived, for the index and resolution."""
    active = None if release.state in TERMINAL_STATES else 1
    share = release.share if release.state is ReleaseState.CANARY else None
    return (
        release.release_id,
        release.tenant,
        release.name,
        release.candidate,
        release.baseline,
        release.state.value,
        release.step,
        plan_to_json(release.plan),
        release.created_at,
        release.updated_at,
        release.step_started_at,
        release.reason,
        release.actor,
        release.hold_until,
        release.version,
        comparison_to_json(release.comparison),
        active,
        share,
    )


def insert(tx: Tx, release: Release) -> None:
    tx.execute(f"INSERT INTO releases ({COLUMNS}) VALUES ({_PLACEHOLDERS})", _values(release))


def update(tx: Tx, release: Release) -> None:
    """Write every column of ``release`` over its row (the caller did the compare-and-set)."""
    names = [column.strip() for column in COLUMNS.split(",")][1:]
    assignments = ", ".join(f"{column} = ?" for column in names)
    values = _values(release)
    tx.execute(f"UPDATE releases SET {assignments} WHERE release_id = ?", (*values[1:], values[0]))


def get(tx: Tx, release_id: str) -> Release | None:
    row = tx.query_one(f"SELECT {COLUMNS} FROM releases WHERE release_id = ?", (release_id,))
    return None if row is None else release_from_row(row)


def active(tx: Tx, tenant: str, name: str) -> Release | None:
    row = tx.query_one(
        f"SELECT {COLUMNS} FROM releases WHERE tenant = ? AND name = ? AND active = 1",
        (tenant, name),
    )
    return None if row is None else release_from_row(row)


def latest(tx: Tx, tenant: str, name: str) -> Release | None:
    row = tx.query_one(
        f"SELECT {COLUMNS} FROM releases WHERE tenant = ? AND name = ? "
        "ORDER BY created_at DESC, release_id DESC LIMIT 1",
        (tenant, name),
    )
    return None if row is None else release_from_row(row)


def latest_promoted(tx: Tx, tenant: str, name: str) -> Release | None:
    """The newest release of the alias that is ``promoted`` (not rolled back since)."""
    row = tx.query_one(
        f"SELECT {COLUMNS} FROM releases WHERE tenant = ? AND name = ? AND state = ? "
        "ORDER BY created_at DESC, release_id DESC LIMIT 1",
        (tenant, name, ReleaseState.PROMOTED.value),
    )
    return None if row is None else release_from_row(row)


def listed(
    tx: Tx, *, include_terminal: bool, tenant: str | None, page: Page | None = None
) -> list[Release]:
    """Oldest first; with ``page``, at most ``page.limit`` of them after the release
    ``page.after`` (which must exist: a typo is a 400, not an empty page)."""
    where = [] if include_terminal else ["active = 1"]
    params: list[object] = []
    if tenant is not None:
        where.append("tenant = ?")
        params.append(tenant)
    if page is not None and page.after is not None:
        cursor = tx.query_one("SELECT created_at FROM releases WHERE release_id = ?", (page.after,))
        if cursor is None:
            raise unknown_cursor(page.after, "release")
        where.append("created_at >= ? AND (created_at > ? OR release_id > ?)")
        params += [cursor[0], cursor[0], page.after]
    order_by = "created_at, release_id"
    rows = paging.select(
        tx, f"{COLUMNS} FROM releases", where=where, params=params, order_by=order_by, page=page
    )
    return [release_from_row(row) for row in rows]


def needing_work(tx: Tx) -> list[Release]:
    """What a controller acts on: releases in flight, and finished ones still holding a pin."""
    rows = tx.query(
        f"SELECT {COLUMNS} FROM releases WHERE active = 1 OR hold_until IS NOT NULL "
        "ORDER BY created_at, release_id"
    )
    return [release_from_row(row) for row in rows]


def release_from_row(row: Row) -> Release:
    return Release(
        release_id=str(row[0]),
        tenant=str(row[1]),
        name=str(row[2]),
        candidate=str(row[3]),
        baseline=str(row[4]),
        state=ReleaseState(row[5]),
        step=int(row[6]),
        plan=plan_from_json(str(row[7])),
        created_at=float(row[8]),
        updated_at=float(row[9]),
        step_started_at=None if row[10] is None else float(row[10]),
        reason=None if row[11] is None else str(row[11]),
        actor=str(row[12]),
        hold_until=None if row[13] is None else float(row[13]),
        version=int(row[14]),
        comparison=comparison_from_json(None if row[15] is None else str(row[15])),
    )
