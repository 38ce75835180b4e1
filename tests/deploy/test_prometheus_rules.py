"""The shipped alert rules (deploy/prometheus/) pass ``promtool check rules`` and their unit
tests (``promtool test rules``), and every alert has a unit test in which it fires."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_kit import render_rules

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = DEPLOY / "loraplex-rules.yml"
UNIT_TESTS = DEPLOY / "loraplex-rules_test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)",
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=DEPLOY, capture_output=True, text=True, timeout=120, check=False
    )


def _alert_names() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


@needs_promtool
def test_promtool_check_rules_accepts_the_rules() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in checked.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", UNIT_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


@needs_promtool
def test_a_wrong_expectation_fails_promtool(tmp_path: Path) -> None:
    """The unit tests can fail: the same file expecting no engine-down alert where one fires."""
    doc = yaml.safe_load(UNIT_TESTS.read_text())
    first = doc["tests"][0]["alert_rule_test"][1]
    assert first["alertname"] == "LoraplexEngineDown" and first["exp_alerts"]
    first["exp_alerts"] = []
    doc["rule_files"] = [str(RULES)]
    (tmp_path / "broken_test.yml").write_text(yaml.safe_dump(doc))
    assert PROMTOOL is not None
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", "broken_test.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert tested.returncode != 0 and "LoraplexEngineDown" in tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_where_it_fires() -> None:
    doc = yaml.safe_load(UNIT_TESTS.read_text())
    fired = {
        check["alertname"]
        for test in doc["tests"]
        for check in test.get("alert_rule_test", [])
        if check["exp_alerts"]
    }
    assert fired == set(_alert_names())


def test_the_seeds_and_serving_alerts_are_all_there() -> None:
    assert set(_alert_names()) >= {
        "LoraplexEngineDown", "LoraplexEngineHung", "LoraplexEngineRestarting",
        "LoraplexQueueResidenceHigh", "LoraplexRateLimitedHigh", "LoraplexUnavailableHigh",
        "LoraplexReloadAfterEviction", "LoraplexAdapterThrash", "LoraplexRemoteMissRatioHigh",
        "LoraplexColdTtftP99High", "LoraplexWarmTtftP99High", "LoraplexReleaseRolledBack",
        "LoraplexFleetReplicaUnhealthy", "LoraplexFleetReplicaLost",
        "LoraplexAdapterEvictionsHigh",
    }  # fmt: skip


def test_rendering_shortens_every_window_and_hold_and_keeps_the_thresholds() -> None:
    shipped = (
        "groups:\n- name: g\n  rules:\n  - alert: A\n"
        "    expr: rate(x[10m]) > 0.05 and increase(y[1h]) > 3\n    for: 10m\n"
    )
    rendered = render_rules(shipped, window="15s", hold="1s")
    assert "rate(x[15s]) > 0.05 and increase(y[15s]) > 3" in rendered
    assert "for: 1s" in rendered and "10m" not in rendered and "1h" not in rendered


@needs_promtool
def test_the_rendered_rules_are_valid_and_keep_every_alert(tmp_path: Path) -> None:
    rendered = render_rules(RULES.read_text(), window="15s", hold="1s")
    assert not re.search(r"\[\d+[mhd]\]", rendered)
    (tmp_path / "rendered.yml").write_text(rendered)
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", "rendered.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in checked.stdout
