"""``loraplex preflight`` against a real server on ``loraplex serve``'s embedded defaults (no
tenant configured, nothing set through the admin API) and the shipped alert rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import RULES_TEXT, admin_client
from live import Live
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.preflight import ITEM_IDS, LoadConfig, PreflightConfig, Status, preflight

# One server cannot be judged on routing (no router); everything else must pass.
SINGLE_SERVER_WARNS = {"router_affinity_and_load"}


def test_the_default_deployment_passes_every_item(default_server: Live, tmp_path: Path) -> None:
    config = PreflightConfig(
        url=default_server.url, admin_key=default_server.server.admin_key, rules_text=RULES_TEXT,
        load=LoadConfig(load_s=3.0),
    )  # fmt: skip
    report = preflight(config)
    statuses = {v.item_id: v.status for v in report.verdicts}
    assert report.exit_code() == 0, report.text()
    assert {i for i, s in statuses.items() if s is not Status.PASS} == SINGLE_SERVER_WARNS, (
        report.text()
    )
    assert all(v.evidence for v in report.verdicts)
    load = report.facts["load"]
    assert load["requests"] > 0 and load["statuses"] == {"200": load["requests"]}
    assert load["distinct_adapters_answered"] == 12  # every demo adapter, over 8 GPU slots
    # Items 6 and 7 pass on what the defaults give, not on luck: the demo's core adapters'
    # warm policy (the bootstrap) and the default per-tenant share of each tier.
    warm = report.verdict("core_warm_policy").evidence[0]
    assert all(m in warm for m in ("acme/support", "globex/search", "initech/chat")), warm
    bounded = report.verdict("tenant_pollution_bounded")
    assert "default per-tenant share of the GPU tier None" not in bounded.evidence[1]
    assert "with a byte cap of their own: none" in bounded.evidence[0]


def test_the_command_prints_one_json_line_writes_the_report_and_revokes_its_keys(
    default_server: Live, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES_TEXT, encoding="utf-8")
    with admin_client(default_server) as admin:
        keys_before = admin.get("/admin/keys").json()
    report_file = tmp_path / "report.json"
    result = CliRunner().invoke(
        app,
        ["preflight", "--url", default_server.url, "--admin-key", default_server.server.admin_key,
         "--json", "--report", str(report_file), "--load-seconds", "2", "--rules", str(rules)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    printed = json.loads(lines[0])
    assert printed == json.loads(report_file.read_text(encoding="utf-8"))
    assert [i["item"] for i in printed["items"]] == list(ITEM_IDS)
    assert printed["ok"] is True and printed["counts"]["FAIL"] == 0
    with admin_client(default_server) as admin:
        keys_after = admin.get("/admin/keys").json()
    new = [k for k in keys_after if k["key_id"] not in {b["key_id"] for b in keys_before}]
    assert len(new) == 3  # one throwaway key per demo tenant ...
    assert all(k["revoked_at"] is not None for k in new)  # ... each revoked after


def test_the_command_refuses_a_bad_option_naming_it(default_server: Live) -> None:
    result = CliRunner().invoke(
        app,
        ["preflight", "--url", default_server.url, "--admin-key", "x", "--load-seconds", "0"],
    )
    assert result.exit_code == 2
    assert "load_s 0.0 is invalid" in result.output


@pytest.mark.parametrize("value", ["0", "-1", "601"])
def test_a_bad_load_seconds_is_refused_naming_the_flag(value: str) -> None:
    # It named only the field, "load_s 0.0 is invalid", which no flag or doc is called.
    args = ["preflight", "--url", "http://127.0.0.1:9", "--admin-key", "x", "--load-seconds", value]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--load-seconds" in " ".join(result.output.split())


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1"])
def test_the_command_refuses_an_unbounded_or_empty_timeout(value: str) -> None:
    # Refused while building the config, before any request (nothing listens on port 9).
    args = ["preflight", "--url", "http://127.0.0.1:9", "--admin-key", "x", "--timeout-s", value]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "timeout_s" in result.output
    assert "expected a finite number > 0" in result.output


def test_a_wrong_admin_key_stops_before_judging(default_server: Live) -> None:
    result = CliRunner().invoke(
        app, ["preflight", "--url", default_server.url, "--admin-key", "not-the-key"]
    )
    assert result.exit_code == 2
    assert "401" in result.output


def test_the_admin_key_is_read_from_the_data_dir(default_server: Live, tmp_path: Path) -> None:
    (tmp_path / "admin-key").write_text(default_server.server.admin_key + "\n", encoding="utf-8")
    args = ["preflight", "--url", default_server.url, "--data-dir", str(tmp_path), "--json"]
    result = CliRunner().invoke(app, [*args, "--load-seconds", "1"], env={"LORAPLEX_ADMIN_KEY": ""})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ok"] is True
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["preflight", "--url", default_server.url, "--data-dir", str(empty)]
    result = CliRunner().invoke(app, args, env={"LORAPLEX_ADMIN_KEY": ""})
    assert result.exit_code == 2
    assert "--admin-key" in result.output
