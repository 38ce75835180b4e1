"""Every metric a shipped alert rule or dashboard panel reads is one the server exports (newop):
an alert on a metric nobody exports never fires and says nothing. ``promtool check rules``
checks the PromQL, not the names; the end-to-end test (tests/deploy/test_alerts_e2e.py) fires
only some of the alerts. The fleet ingress's family (``loraplex_fleet_*``) and the tracing
counters (``loraplex_trace_*``, only with tracing on) are not on a lone server's page: those are
checked against the names their collectors register. And docs/operations.md's *Metrics* lists
every family a lone server exports, and each name it lists is exported (or registered by the
collector of the setting it names: a mode, tracing, ``loraplex serve``'s listener): nothing held
the section to the exporter; the first new-user round compared them by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import Rig
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "loraplex-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "loraplex.json"
# PromQL words that are not metric names
PROMQL = {
    "sum", "by", "rate", "increase", "histogram_quantile", "or", "and", "unless", "on",
    "without", "ignoring", "max", "min", "avg", "count", "irate", "topk", "bottomk", "clamp_min",
    "clamp_max", "time", "vector", "bool", "offset", "group_left", "group_right", "absent",
}  # fmt: skip
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")
ELSEWHERE = {  # prefix: the module whose collector registers the family, not a lone server's
    "loraplex_fleet_": REPO / "loraplex" / "fleet" / "state.py",
    "loraplex_trace_": REPO / "loraplex" / "server" / "metrics_traces.py",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, strings, ranges, grouping
    clauses and numbers dropped)."""
    bare = re.sub(r"\{[^}]*\}|\"[^\"]*\"|\[[^\]]*\]", " ", expr)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    words = re.findall(r"(?<![\w.])[a-zA-Z_:][\w:]*", bare)
    return {w for w in words if w not in PROMQL}


def read_names() -> dict[str, str]:
    """Each metric name the rules and the dashboard read, with where it is read."""
    import yaml

    out = {}
    for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            out.update(dict.fromkeys(metric_names(rule["expr"]), f"alert {rule['alert']}"))
    for panel in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]:
        for target in panel.get("targets", []):
            out.update(dict.fromkeys(metric_names(target["expr"]), f"panel {panel['title']}"))
    return out


def test_the_name_reader_finds_the_names_and_only_them() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, priority_class) (rate(request_ttft_seconds_bucket"
        '{cold="true"}[10m]))) > 2 or increase(loraplex_engine_restarts_total[15m]) >= 3'
    )
    assert metric_names(expr) == {"request_ttft_seconds_bucket", "loraplex_engine_restarts_total"}


def test_every_metric_an_alert_or_panel_reads_is_exported(rig: Rig) -> None:
    response = rig.client.get("/metrics", headers=rig.admin)
    assert response.status_code == 200
    # families, not samples: a labelled family has no sample before its first request or load
    exported = {f.name for f in text_string_to_metric_families(response.text)}
    read = read_names()
    assert "loraplex_engine_up" in read and "adapter_thrash_events_total" in read
    missing = []
    for name, where in sorted(read.items()):
        prefix = next((p for p in ELSEWHERE if name.startswith(p)), None)
        family = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        if prefix is None:
            if not {name, family} & exported:
                missing.append(f"{name} ({where}): not on the server's /metrics")
            continue
        if f'"{family}"' not in ELSEWHERE[prefix].read_text(encoding="utf-8"):
            missing.append(f"{name} ({where}): not registered in {ELSEWHERE[prefix].name}")
    assert missing == [], "\n".join(missing)


def _documented_metrics() -> set[str]:
    """The metric names docs/operations.md's *Metrics* section lists (label sets dropped)."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    start = text.index("\n### Metrics\n")
    section = text[start : text.index("\n## ", start)]
    named = re.findall(r"`((?:vllm:)?[a-z][a-z_:]*)(?:\{[^`]*\})?`", section)
    named.remove("adapter_wait")  # a value of engine_requests' state label
    prefixes = ("loraplex_", "adapter_", "vllm:", "request_", "requests_", "engine_")
    return {
        n
        for n in named
        if n.startswith(prefixes) or n in ("generated_tokens_total", "cold_start_rate")
    }


LISTENER = (  # loraplex serve's own listener's families (the test app runs without it)
    REPO / "loraplex" / "server" / "gate_metrics.py",
    REPO / "loraplex" / "server" / "listeners" / "unsent.py",
)
CONDITIONAL = {  # families a server exports only in some settings, as the section says
    "loraplex_mode_": (REPO / "loraplex" / "server" / "metrics_modes.py",),  # mode not unmerged
    "loraplex_trace_": (REPO / "loraplex" / "server" / "metrics_traces.py",),  # tracing on
    "loraplex_connections": LISTENER,
    "loraplex_http_refused": LISTENER,
    "loraplex_unsent_response_bytes": LISTENER,
}


def test_the_metrics_section_lists_what_the_server_exports(rig: Rig) -> None:
    """newop: every family a lone server's /metrics has is in operations.md's *Metrics*, and each
    name there is exported (or registered by the collector of a setting the section names)."""
    response = rig.client.get("/metrics", headers=rig.admin)
    families = {f.name for f in text_string_to_metric_families(response.text)}
    documented = _documented_metrics()
    assert {"adapter_cache_hits_total", "vllm:lora_requests_info"} <= documented
    undocumented = [f for f in sorted(families) if not {f, f + "_total"} & documented]
    unexported = []
    for name in sorted(documented):
        family = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        if {name, family} & families:
            continue
        prefix = next((p for p in CONDITIONAL if name.startswith(p)), None)
        sources = CONDITIONAL[prefix] if prefix is not None else ()
        if not any(f'"{family}"' in p.read_text(encoding="utf-8") for p in sources):
            unexported.append(name)
    assert (undocumented, unexported) == ([], [])
