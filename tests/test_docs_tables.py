"""The settings tables beyond ``serve`` and ``fleet up`` stay true to their dataclasses: the
router's (docs/router.md, ``RouterConfig``), the fleet's ``topology`` keys (docs/operations.md,
``TopologyConfig``) and the qualification plan's (docs/qualification.md, ``QualifyPlan``), each
key documented once, none that is gone, and a plain documented default the code's; and the
release store's methods releases.md lists exist."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from loraplex.qualify.plan import QualifyPlan
from loraplex.router.config import RouterConfig
from loraplex.router.topology import TopologyConfig

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _defaults(cls: Any) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def _same(documented: str, default: Any) -> bool:
    return float(documented.replace(",", "")) == float(default)


def test_router_table_is_router_config() -> None:
    text = (DOCS / "router.md").read_text(encoding="utf-8").split("## Configuration")[1]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text.split("\n## ")[0], flags=re.M))
    code = _defaults(RouterConfig)
    assert set(rows) == set(code)
    assert [k for k, v in rows.items() if not _same(v, code[k])] == []


def test_topology_keys_are_topology_config() -> None:
    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `topology` (file only"))
    keys = dict(re.findall(r"`(\w+)` \(([\d.]+)", row))
    code = _defaults(TopologyConfig)
    assert set(keys) == set(code)
    assert [k for k, v in keys.items() if not _same(v, code[k])] == []


def test_plan_table_is_qualify_plan() -> None:
    text = (DOCS / "qualification.md").read_text(encoding="utf-8").split("\n## The plan\n")[1]
    cells = re.findall(r"^\| ((?:`[\w.]+`(?:, )?)+) \|", text.split("\n## ")[0], flags=re.M)
    documented = {key for cell in cells for key in re.findall(r"`([\w.]+)`", cell)}
    keys = set()
    for field in dataclasses.fields(QualifyPlan):
        default = _defaults(QualifyPlan)[field.name]
        table = field.default_factory() if default is dataclasses.MISSING else default  # type: ignore[misc]
        if dataclasses.is_dataclass(table):
            keys |= {f"{field.name}.{f.name}" for f in dataclasses.fields(table)}
        else:
            keys.add(field.name)
    assert documented == keys


def test_release_api_section_names_real_methods() -> None:
    from loraplex.release.controller import ReleaseController
    from loraplex.release.store import ReleaseStore

    text = (DOCS / "releases.md").read_text(encoding="utf-8").split("## Programmatic API")[1]
    called = {n for group in re.findall(r"`([\w|]+)\(", text) for n in group.split("|")}
    assert {"start_release", "latest_release", "promote", "ReleaseController"} <= called
    owners = (ReleaseStore, ReleaseController)
    missing = {n for n in called - {"ReleaseController"} if not any(hasattr(o, n) for o in owners)}
    assert missing == set()


def test_alert_table_is_the_shipped_rules() -> None:
    """observability.md's alert table and its "N alerts in M groups" are the rules file's."""
    import yaml

    rules = DOCS.parent / "deploy" / "prometheus" / "loraplex-rules.yml"
    groups = yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    text = (DOCS / "observability.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(Loraplex\w+)` \|", text, flags=re.M))
    assert documented == alerts
    words = {5: "five", 6: "six", 4: "four", 7: "seven"}
    assert f"({len(alerts)} alerts in {words.get(len(groups), len(groups))} groups)" in text
