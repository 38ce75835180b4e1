"""``loraplex qualify`` against real servers started by the test: the quick run passes with every
cell's four pass ratios, and two broken deployments are caught (failed cells, exit 1): an alias
that points at a revision with the wrong weights, and a server that serves a foreign tenant's
adapter (a fault injected into this test's server only)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from live import Live, live_server

from loraplex.cli import app
from loraplex.demo.assets import DemoAssets
from loraplex.qualify.population import HOSTILE

CHECKS = ("correct_revision_ratio", "quality_ratio", "latency_ratio", "isolation_ratio")
# One cell, no comparators: what the broken-deployment tests need to see a failure.
ONE_CELL_PLAN = """compare = []
[matrix]
design = "covering"
active_adapters = [1]
rank_distributions = ["all-8"]
token_shapes = ["short"]
popularities = ["uniform"]
[traffic]
requests_per_cell = 4
deployment_adapters = ["acme/support"]
[isolation]
hostile_adapters = 2
hostile_requests_per_cell = 2
"""


@pytest.fixture
def server(demo_assets: DemoAssets, tmp_path: Path) -> Iterator[Live]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with live_server(demo_assets, data_dir, torch_threads=1, max_lora_rank=128) as live:
        yield live


def _qualify(live: Live, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    args = [
        "qualify", "--url", live.url, "--admin-key", live.server.admin_key, "--json",
        "--report-dir", str(tmp_path / "reports"), "--assets", str(live.assets.root), *extra,
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, (
        f"no JSON line (exit {result.exit_code}): {result.output[-2000:]!r} {result.exception!r}"
    )
    return result.exit_code, json.loads(lines[-1])


def _plan(tmp_path: Path) -> str:
    path = tmp_path / "plan.toml"
    path.write_text(ONE_CELL_PLAN, encoding="utf-8")
    return str(path)


def test_quick_run_passes_with_four_ratios_per_cell(server: Live, tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    # One comparator, in-context: the run's comparator path (cell traffic -> measure -> priced
    # beside loraplex -> cost plot) is the same for both; the separate deployments' merge and
    # servers (40 s of this run) are measured in tests/qualify/baselines/test_baseline_measure.py.
    plan.write_text(
        'compare = ["in_context"]\n[traffic]\ndeployment_adapters = ["acme/support"]\n',
        encoding="utf-8",
    )
    code, report = _qualify(server, tmp_path, "--quick", "--plan", str(plan))
    assert code == 0, report["failed_cells"]
    assert report["num_cells"] == 4 and report["failed_cells"] == []
    for cell in report["cells"]:
        assert all(cell[k] is not None for k in CHECKS), cell
        assert cell["correct_revision_ratio"] == 1.0 and cell["isolation_ratio"] == 1.0
        assert cell["methods"]["loraplex"]["cost_per_correct_request"] > 0
        assert set(cell["methods"]) == {"loraplex", "in_context"}
        assert cell["methods"]["in_context"]["method"] == "in_context", cell["methods"]
        assert cell["hostile"]["breaches"] == [] and cell["hostile"]["probes"] > 0
        assert "qualify-a/" in json.dumps(cell["quality_per_revision"])
    assert report["retire_failures"] == []
    run_dirs = [p for p in (tmp_path / "reports").iterdir() if p.name[0].isdigit()]
    html = (run_dirs[0] / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 3
    # Retired: the generated revisions no longer resolve through their aliases.
    key = server.key("acme")
    admin = {"Authorization": f"Bearer {server.server.admin_key}"}
    shown = httpx.get(f"{server.url}/admin/adapters/qualify-a/all-8-0000", headers=admin).json()
    assert [r["state"] for r in shown["revisions"]] == ["deprecated"]
    assert key  # the demo tenants' keys are untouched


def _upload_wrong_weights(live: Live) -> None:
    """acme/support@bad: r2's weights under r1's probe, and the alias moved to it."""
    root = live.assets.root / "adapters" / "acme" / "support"
    weights = (root / "r2" / "adapter_model.safetensors").read_bytes()
    files = {
        "config": ("adapter_config.json", (root / "r1" / "adapter_config.json").read_bytes()),
        "weights": ("adapter_model.safetensors", weights),
    }
    r1 = next(m for m in live.assets.adapters if m.ref == "acme/support@r1")
    fields = {
        "tenant": "acme", "name": "support", "revision": "bad",
        "probe_prompt": r1.probe_prompt, "expected_continuation": r1.expected_continuation,
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {live.server.admin_key}"}
    with httpx.Client(base_url=live.url, headers=headers, timeout=60) as admin:
        reply = admin.post("/admin/adapters/upload", data=fields, files=files)
        assert reply.status_code in (200, 201), reply.text
        reply = admin.put(
            "/admin/adapters/acme/support/alias", json={"targets": [{"revision": "bad"}]}
        )
        assert reply.status_code == 200, reply.text


def test_alias_at_wrong_weights_fails_the_cell(server: Live, tmp_path: Path) -> None:
    _upload_wrong_weights(server)
    code, report = _qualify(server, tmp_path, "--plan", _plan(tmp_path))
    assert code == 1
    (cell,) = report["cells"]
    assert not cell["passed"] and cell["quality_ratio"] < 1.0
    assert cell["quality_per_revision"]["acme/support@bad"]["pass_ratio"] == 0.0
    assert any(reason.startswith("quality_ratio") for reason in cell["reasons"])
    assert report["failed_cells"] == [cell["cell_id"]]


def _serve_foreign_adapters(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The injected fault: resolution as the owner of whatever adapter the model string names,
    so a tenant reaches another tenant's private adapter. Only this test's server has it."""
    registry = live.server.registry
    honest = registry.resolve_revision

    def leaky(caller: str, model_string: str, *args: Any, **kwargs: Any) -> Any:
        owner = model_string.partition("/")[0] if "/" in model_string else caller
        return honest(owner, model_string, *args, **kwargs)

    monkeypatch.setattr(registry, "resolve_revision", leaky)


def test_serving_a_foreign_tenants_adapter_fails_the_cell(
    server: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serve_foreign_adapters(server, monkeypatch)
    code, report = _qualify(server, tmp_path, "--plan", _plan(tmp_path))
    assert code == 1
    (cell,) = report["cells"]
    assert not cell["passed"] and cell["isolation_ratio"] == 0.0
    assert cell["hostile"]["breaches"], cell["hostile"]
    assert any("hostile asked" in b for b in cell["hostile"]["breaches"])
    assert HOSTILE not in json.dumps(cell["quality_per_revision"])
    # No cell defines a cost here: the HTML report is still written.
    (run_dir,) = [p for p in (tmp_path / "reports").iterdir() if p.name[0].isdigit()]
    assert "data:image/png;base64," in (run_dir / "report.html").read_text(encoding="utf-8")


def test_url_and_self_are_exclusive_and_plan_errors_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(app, ["qualify", "--self", "--url", "http://127.0.0.1:1"])
    assert both.exit_code == 2 and "exactly one of --url and --self" in both.output
    bad = tmp_path / "plan.toml"
    bad.write_text("[traffic]\nrate = 3\n", encoding="utf-8")
    refused = runner.invoke(app, ["qualify", "--self", "--plan", str(bad)])
    assert refused.exit_code == 2 and "traffic.'rate'" in refused.output
