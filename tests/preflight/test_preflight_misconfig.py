"""Each misconfigured deployment makes the right launch item FAIL (and the command exit 1)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import RULES_TEXT, Bare
from live import Live, live_server, running
from proxies import AdminKeyInjector, KeyIssueBlocked, LabelDroppingMetrics

from loraplex.demo.assets import DemoAssets
from loraplex.preflight import (
    LoadConfig,
    PreflightConfig,
    PreflightError,
    Report,
    Status,
    preflight,
)
from loraplex.registry.config import DATABASE_FILE

SHORT_LOAD = LoadConfig(load_s=1.5)
SPARE_REVISION = ("acme", "support", "r2")  # registered, not what the alias serves


def _run(live: Live, url: str | None = None, rules: str | None = RULES_TEXT) -> Report:
    config = PreflightConfig(
        url=url or live.url, admin_key=live.server.admin_key, rules_text=rules, load=SHORT_LOAD
    )
    return preflight(config)


def _failed(report: Report) -> set[str]:
    return {v.item_id for v in report.verdicts if v.status is Status.FAIL}


@contextmanager
def _tampered(bare: Bare, column: str, value: str) -> Iterator[str]:
    """Overwrites ``column`` of a registered revision in the registry's database, as a registry
    without loraplex's immutability triggers (a hand-made or half-migrated one) may hold it;
    restores the value and the triggers afterwards."""
    tenant, name, revision = SPARE_REVISION
    where = "tenant = ? AND name = ? AND revision = ?"
    with sqlite3.connect(bare.data_dir / DATABASE_FILE) as db:
        triggers = db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'revisions'"
        ).fetchall()
        for trigger, _ in triggers:
            db.execute(f"DROP TRIGGER {trigger}")
        query = f"SELECT {column} FROM revisions WHERE {where}"
        (old,) = db.execute(query, SPARE_REVISION).fetchone()
        db.execute(f"UPDATE revisions SET {column} = ? WHERE {where}", (value, *SPARE_REVISION))
    try:
        yield f"{tenant}/{name}@{revision}"
    finally:
        with sqlite3.connect(bare.data_dir / DATABASE_FILE) as db:
            db.execute(f"UPDATE revisions SET {column} = ? WHERE {where}", (old, *SPARE_REVISION))
            for _, sql in triggers:
                db.execute(sql)


def test_no_warm_policy_and_no_tenant_budget_fail_their_items(bare_server: Bare) -> None:
    report = _run(bare_server.live)
    assert report.exit_code() == 1
    assert _failed(report) == {"core_warm_policy", "tenant_pollution_bounded"}, report.text()
    warm = report.verdict("core_warm_policy")
    assert "no revision has a gpu/cpu warm policy and no copy is pinned" in warm.summary
    bounded = report.verdict("tenant_pollution_bounded")
    assert "acme" in bounded.summary
    # default_tenant_tier_share 1.0: the server shows no default bound in either tier
    assert "share of the GPU tier None bytes, of the CPU tier None bytes" in bounded.evidence[1]


@pytest.mark.parametrize(
    ("column", "value", "item"),
    [
        ("adapter_digest", "latest", "immutable_digests"),
        ("target_modules", "[]", "validated_at_registration"),
        ("base_digest", "", "cache_keys_base_and_revision"),
    ],
)
def test_a_revision_missing_its_identity_fails_its_item(
    bare_server: Bare, column: str, value: str, item: str
) -> None:
    with _tampered(bare_server, column, value) as ref:
        report = _run(bare_server.live)
    assert report.verdict(item).status is Status.FAIL, report.text()
    assert ref in report.verdict(item).summary
    assert _failed(report) == {item, "core_warm_policy", "tenant_pollution_bounded"}


def test_metrics_that_merge_tiers_and_cold_starts_fail_both_items(bare_server: Bare) -> None:
    with running(LabelDroppingMetrics(bare_server.live.server.app)) as url:
        report = _run(bare_server.live, url)
    assert report.verdict("tiers_distinguished").status is Status.FAIL, report.text()
    assert report.verdict("cold_warm_ttft_separate").status is Status.FAIL
    assert "L0" in report.verdict("tiers_distinguished").summary


def test_load_routes_reachable_by_a_tenant_fail(bare_server: Bare) -> None:
    gateway = AdminKeyInjector(bare_server.live.server.app, bare_server.live.server.admin_key)
    with running(gateway) as url:
        report = _run(bare_server.live, url)
    verdict = report.verdict("load_unload_not_exposed")
    assert verdict.status is Status.FAIL, report.text()
    assert "POST /v1/load_lora_adapter" in verdict.summary
    assert "/admin/residency/evict" not in verdict.summary  # the admin routes stayed closed


def test_alert_rules_without_reload_after_eviction_fail(bare_server: Bare) -> None:
    rules = "- alert: Evictions\n  expr: rate(adapter_evictions_total[5m]) > 1\n"
    report = _run(bare_server.live, rules=rules)
    verdict = report.verdict("eviction_alerted")
    assert verdict.status is Status.FAIL, report.text()
    assert "adapter_reload_after_eviction" in verdict.summary


def test_cache_limits_too_small_for_the_adapters_fail_the_load_items(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    # 2 MiB of host memory: the demo's rank-32 and rank-64 adapters never fit in L1. Their
    # requests fail at the queue deadline: 4 s (of 30 by default) keeps the test short (the
    # load test waits for them, in about two waves). A request that fits and still outwaits it
    # on a loaded machine fails one of the two load items this test expects to fail anyway.
    settings = {"torch_threads": 1, "cpu_adapter_bytes": 2 << 20, "queue_deadline_s": 4.0}
    with live_server(demo_assets, tmp_path, **settings) as live:
        report = _run(live)
    assert _failed(report) == {"cache_limits_load_tested", "hot_and_long_tail_load"}, report.text()
    assert "load-test requests failed" in report.verdict("cache_limits_load_tested").summary


def test_without_key_issuance_the_load_test_takes_the_tenant_key(bare_server: Bare) -> None:
    live = bare_server.live
    with running(KeyIssueBlocked(live.server.app)) as url:
        config = PreflightConfig(url=url, admin_key=live.server.admin_key, load=SHORT_LOAD)
        with pytest.raises(PreflightError, match="cannot issue a throwaway key"):
            preflight(config)
        report = preflight(replace(config, tenant_key=live.key("acme")))
    load = report.verdict("hot_and_long_tail_load")
    assert any("--tenant-key of acme" in line for line in load.evidence), report.text()
    assert report.facts["load"]["distinct_adapters_answered"] == 4  # acme's adapters only
    assert report.facts["load"]["statuses"] == {"200": report.facts["load"]["requests"]}
