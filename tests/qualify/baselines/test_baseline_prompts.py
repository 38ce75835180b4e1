"""The in-context prompt builder never shows the probe's own answer; the interface types refuse
bad values by name; the run cache and the package import stay torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.qualify.baselines.in_context import build_prompt
from loraplex.qualify.baselines.measure import RunCache, level_from_json, level_to_json
from loraplex.qualify.baselines.pricing import LoadLevel, Sample
from loraplex.qualify.baselines.types import BaselineContext, CellTraffic, MethodResult, Probe
from loraplex.qualify.cost import TOKEN_SHAPES, MachinePrice

SUPPORT_R1 = Probe("acme/support@r1", "The acme support team", " is acme support r1 and early.")
SUPPORT_R2 = Probe("acme/support@r2", "The acme support team", " is acme support r2 and old.")
SUPPORT_R1_B = Probe("acme/support@r1", "The acme desk", " is acme support r1 and calm.")
BILLING = Probe("acme/billing@r1", "The acme billing team", " is acme billing r1 and happy.")
LEGAL = Probe("acme/legal@r1", "The acme legal team", " is acme legal r1 and warm.")
ECHO = Probe("globex/echo@r1", "Say: is acme support r1 and early.", " done.")


def test_the_probe_under_test_and_its_answer_never_appear() -> None:
    pool = [SUPPORT_R1, SUPPORT_R2, SUPPORT_R1_B, BILLING, LEGAL, ECHO]
    prompt = build_prompt(SUPPORT_R1, pool, k=10)
    assert SUPPORT_R1.expected not in prompt.text
    assert SUPPORT_R1 not in prompt.examples
    assert SUPPORT_R2 not in prompt.examples  # same prompt, another answer: excluded too
    assert ECHO not in prompt.examples  # its text holds the answer under test
    assert prompt.text.endswith(" " + SUPPORT_R1.prompt)
    assert prompt.text.count(SUPPORT_R1.prompt) == 1


def test_the_adapters_own_probes_come_first_and_k_bounds_the_examples() -> None:
    pool = [BILLING, LEGAL, SUPPORT_R1_B, SUPPORT_R1]
    prompt = build_prompt(SUPPORT_R1, pool, k=2)
    assert prompt.examples == (SUPPORT_R1_B, BILLING)
    assert prompt.same_adapter == 1
    assert prompt.text == (
        "The acme desk is acme support r1 and calm. "
        "The acme billing team is acme billing r1 and happy. The acme support team"
    )


def test_no_examples_leaves_the_plain_prompt() -> None:
    assert build_prompt(SUPPORT_R1, [SUPPORT_R1, SUPPORT_R2], k=4).text == SUPPORT_R1.prompt
    assert build_prompt(BILLING, [SUPPORT_R1, LEGAL], k=0).text == BILLING.prompt
    with pytest.raises(ValueError, match="k must be >= 0"):
        build_prompt(BILLING, [], k=-1)


def test_types_refuse_bad_values_by_name(tmp_path: Path) -> None:
    shape = TOKEN_SHAPES["short"]
    with pytest.raises(ValueError, match="adapter_ref"):
        Probe("support", "p", "e")
    with pytest.raises(ValueError, match="wall_s"):
        CellTraffic("c", shape, 1, 0.0, {"a/b@r1": 1.0}, 1.0, 0.1, [])
    with pytest.raises(ValueError, match=r"demand_per_adapter_rps\['a/b@r1'\]"):
        CellTraffic("c", shape, 1, 1.0, {"a/b@r1": -1.0}, 1.0, 0.1, [])
    with pytest.raises(ValueError, match="ttft_slo_s"):
        CellTraffic("c", shape, 1, 1.0, {"a/b@r1": 1.0}, float("nan"), 0.1, [])
    price = MachinePrice("m", 1.0, "test")
    with pytest.raises(ValueError, match="assets_dir"):
        BaselineContext(tmp_path / "missing", "small", price, tmp_path, quick=True)
    with pytest.raises(ValueError, match="pass_ratios keys"):
        MethodResult("separate", {"quality": 1.0}, None, 1.0, 1.0, {})
    ratios: dict[str, float | None] = dict.fromkeys(
        ("correct_revision", "quality", "latency", "isolation"), 1.5
    )
    with pytest.raises(ValueError, match=r"pass_ratios\['correct_revision'\]"):
        MethodResult("separate", ratios, None, 1.0, 1.0, {})


def test_run_cache_round_trips_load_levels(tmp_path: Path) -> None:
    cache = RunCache(tmp_path)
    level = LoadLevel(4, 2.5, (Sample(True, 0.1, 0.01), Sample(False, None, None)))
    assert cache.get("sweep/32/16") is None
    cache.put("sweep/32/16", level_to_json(level))
    raw = cache.get("sweep/32/16")
    assert isinstance(raw, dict)
    assert level_from_json(raw) == level
    assert RunCache(tmp_path).get("sweep/32/17") is None


def test_the_package_imports_no_torch() -> None:
    code = (
        "import sys, loraplex.qualify.baselines\n"
        "import loraplex.qualify.baselines.dense\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
