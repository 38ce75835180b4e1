"""``scripts/serve-ab`` and its pieces (``bench.peer.tree_ab``): two checkouts through real
servers in ABBA order, each lifetime's figure the median of its batches, the ratio of the sides'
medians (null when undefined), and greedy continuations compared over every lifetime."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from loraplex.bench.peer.tree_ab import TreeLifetime, ab_result, lifetime_order
from loraplex.demo.assets import DemoAssets

REPO = Path(__file__).resolve().parents[2]


def _lifetime(
    side: int, base: tuple[float, ...], greedy: tuple[str | None, ...] = ("a",)
) -> TreeLifetime:
    base_cpu = tuple(1 / b if b else math.inf for b in base)  # ms per token
    return TreeLifetime(side, greedy, adapter=(10.0, 30.0, 20.0), base=base,
                        adapter_cpu=(0.5, 0.25, 0.75), base_cpu=base_cpu,
                        failures=side, first_answer_s=1.234)  # fmt: skip


def test_sides_alternate_abba() -> None:
    assert lifetime_order(3) == [0, 1, 1, 0, 0, 1]


def test_each_lifetime_counts_its_median_batch_and_the_ratio_is_of_medians() -> None:
    lifetimes = [
        _lifetime(0, (100.0, 300.0, 200.0)),  # median 200
        _lifetime(1, (500.0, 100.0, 300.0)),  # median 300
        _lifetime(1, (400.0, 400.0, 100.0)),  # median 400
        _lifetime(0, (100.0, 100.0, 900.0)),  # median 100
    ]
    result = ab_result(lifetimes, ("old", "new"))
    assert result["order"] == ["old", "new", "new", "old"]
    assert result["old"]["base"] == {"median": 150, "min": 100, "max": 200, "all": [200, 100]}
    assert result["new"]["base"] == {"median": 350, "min": 300, "max": 400, "all": [300, 400]}
    assert result["new_over_old_base"] == round(350 / 150, 3)
    assert result["new_over_old_adapter"] == 1.0
    # engine CPU per token: each lifetime's median batch too (base: 1/200, 1/300, ...)
    assert result["old"]["base_engine_cpu_ms_per_token"]["all"] == [0.005, 0.01]
    assert result["new"]["adapter_engine_cpu_ms_per_token"]["median"] == 0.5
    assert result["new_over_old_base_engine_cpu_ms_per_token"] == round(
        (1 / 300 + 1 / 400) / 2 / ((1 / 200 + 1 / 100) / 2), 3
    )
    assert (result["old"]["failures"], result["new"]["failures"]) == (0, 2)
    assert result["old"]["first_answer_s"] == [1.23, 1.23]
    assert result["greedy_identical"] is True


def test_an_undefined_ratio_is_null_and_differing_or_failed_greedy_is_not_identical() -> None:
    zero = [_lifetime(0, (0.0,)), _lifetime(1, (5.0,), ("b",))]
    result = ab_result(zero, ("old", "new"))
    assert result["new_over_old_base"] is None  # never 0
    # a batch without a token has no CPU per token: null, and so is the ratio over it
    assert result["old"]["base_engine_cpu_ms_per_token"]["all"] == [None]
    assert result["new_over_old_base_engine_cpu_ms_per_token"] is None
    assert result["greedy_identical"] is False
    failed = [_lifetime(0, (1.0,), (None,)), _lifetime(1, (1.0,), (None,))]
    assert ab_result(failed, ("old", "new"))["greedy_identical"] is False


def test_two_lifetimes_of_this_checkout_through_real_servers(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "serve-ab"), "--trees", f"{REPO},{REPO}",
         "--lifetimes", "1", "--batches", "1", "--requests", "4", "--root", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["order"] == ["old", "new"]
    for side in ("old", "new"):
        assert result[side]["lifetimes"] == 1
        assert result[side]["failures"] == 0
        assert result[side]["base"]["median"] > 0
        assert result[side]["base_engine_cpu_ms_per_token"]["median"] > 0  # the engine's /proc
    assert result["greedy_identical"] is True  # the same code answers alike
    assert len(list((tmp_path / "runs").iterdir())) == 2  # each server's log is kept


def test_one_checkout_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "serve-ab"), "--trees", str(REPO)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--trees" in done.stderr
