"""The shipped Grafana dashboard (deploy/grafana/loraplex.json): the rows the operator needs, a
Prometheus query on every panel, and no adapter or tenant identity in any of them (the seeds:
keep private adapter identities off broadly accessible dashboards). Whether every query returns
data from a real Prometheus scraping a real server is ``test_alerts_e2e``'s."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_kit import DASHBOARD

ROWS = {"Engine", "Adapter tiers", "Cold vs warm TTFT", "Per tenant class", "Releases"}
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return panels


def test_the_rows_cover_tiers_ttft_classes_releases_and_fleet() -> None:
    rows = {p["title"] for p in _panels() if p["type"] == "row"}
    assert rows >= ROWS and "Fleet (ingress)" in rows


def test_every_panel_queries_the_chosen_prometheus() -> None:
    panels = [p for p in _panels() if p["type"] != "row"]
    assert len(panels) >= 25
    ids = [p["id"] for p in _panels()]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])


def test_no_panel_shows_adapter_or_tenant_identities() -> None:
    for panel in _panels():
        for target in panel.get("targets", []):
            expr, legend = target["expr"], target["legendFormat"]
            grouped = {g.strip() for m in _GROUPING.findall(expr) for g in m.split(",")}
            assert not grouped & {"adapter", "revision", "tenant"}, (panel["title"], expr)
            assert "lora_requests_info" not in expr and "adapter_requests_total{" not in expr
            assert not re.search(r"\{\{\s*(adapter|revision|tenant)\s*\}\}", legend), legend


def test_the_responses_panel_names_every_code_it_plots() -> None:
    """The tenant-responses panel plots every ``code`` label (``metrics_status.code_label``:
    429, 503 and the classes 2xx..5xx); its title said ``(429, 503)`` alone, so the 5xx series
    ``LoraplexServerErrors`` alerts on read as absent from it (newop5)."""
    [panel] = [
        p
        for p in _panels()
        if any("loraplex_tenant_responses_total" in t["expr"] for t in p.get("targets", []))
    ]
    assert "code" in _GROUPING.findall(panel["targets"][0]["expr"])[0]
    assert all(code in panel["title"] for code in ("2xx..5xx", "429", "503")), panel["title"]
