"""The plan file: defaults, every key validated, unknown keys refused by their dotted name; and
the matrix the plan forms (factorial, covering, popularity draws)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from loraplex.qualify.cells import Cell, adapters_needed, cells, draw_indices
from loraplex.qualify.cost import TOKEN_SHAPES
from loraplex.qualify.plan import (
    ACTIVE_ADAPTERS,
    POPULARITIES,
    RANK_DISTRIBUTIONS,
    PlanError,
    QualifyPlan,
    load_plan,
    plan_from_dict,
    quick,
)


def test_defaults_form_the_full_factorial_matrix() -> None:
    plan = load_plan(None)
    assert plan == QualifyPlan()
    got = cells(plan.matrix)
    assert len(got) == 4 * 3 * 3 * 4 == 144
    assert len({c.cell_id for c in got}) == 144
    assert adapters_needed(got) == {d: 1024 for d in RANK_DISTRIBUTIONS}
    assert plan.compare == ("separate", "in_context")


def test_covering_design_runs_every_level_of_every_axis() -> None:
    plan = plan_from_dict({"matrix": {"design": "covering"}})
    got = cells(plan.matrix)
    assert len(got) == 4
    assert {c.active_adapters for c in got} == set(ACTIVE_ADAPTERS)
    assert {c.rank_distribution for c in got} == set(RANK_DISTRIBUTIONS)
    assert {c.shape.name for c in got} == set(TOKEN_SHAPES)
    assert {c.popularity for c in got} == set(POPULARITIES)


def test_quick_is_a_small_covering_run() -> None:
    plan = quick(QualifyPlan())
    got = cells(plan.matrix)
    assert len(got) == 4 and {c.active_adapters for c in got} == {1, 16}
    assert plan.traffic.requests_per_cell <= 8


def test_toml_and_json_plans_load(tmp_path: Path) -> None:
    toml = tmp_path / "plan.toml"
    toml.write_text(
        "compare = []\nmachines = 2\n[matrix]\nactive_adapters = [16]\n"
        'popularities = ["zipf-1.2"]\n[objectives]\nttft_warm_s = 1.5\n'
        '[price]\nname = "gpu"\nusd_per_hour = 3.0\nsource = "x"\n',
        encoding="utf-8",
    )
    plan = load_plan(toml)
    assert plan.matrix.active_adapters == (16,) and plan.matrix.popularities == ("zipf-1.2",)
    assert plan.objectives.ttft_warm_s == 1.5 and plan.price.usd_per_hour == 3.0
    assert plan.machines == 2 and plan.compare == ()
    as_json = tmp_path / "plan.json"
    as_json.write_text(
        json.dumps({"traffic": {"requests_per_cell": 3, "max_retries": 0}}), encoding="utf-8"
    )
    assert load_plan(as_json).traffic.requests_per_cell == 3
    assert load_plan(as_json).traffic.max_retries == 0


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"bogus": 1}, "'bogus'"),
        ({"matrix": {"desgin": "factorial"}}, "matrix.'desgin'"),
        ({"traffic": {"rate": 3}}, "traffic.'rate'"),
        ({"objectives": {"ttft_s": 1}}, "objectives.'ttft_s'"),
        ({"isolation": {"attackers": 2}}, "isolation.'attackers'"),
        ({"price": {"usd": 1}}, "price.'usd'"),
    ],
)
def test_unknown_keys_are_refused_by_name(raw: dict[str, object], named: str) -> None:
    with pytest.raises(PlanError, match=re.escape(f"plan key {named} is unknown")):
        plan_from_dict(raw)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"matrix": {"design": "fractional"}}, "matrix.design"),
        ({"matrix": {"active_adapters": [0]}}, "matrix.active_adapters"),
        ({"matrix": {"rank_distributions": ["all-9"]}}, "matrix.rank_distributions"),
        ({"matrix": {"token_shapes": ["short", "short"]}}, "matrix.token_shapes"),
        ({"matrix": {"popularities": []}}, "matrix.popularities"),
        ({"traffic": {"requests_per_cell": 0}}, "traffic.requests_per_cell"),
        ({"traffic": {"concurrency": 1.5}}, "traffic.concurrency"),
        ({"traffic": {"reference_sample": 50}}, "traffic.reference_sample"),
        ({"traffic": {"deployment_adapters": ["acme"]}}, "traffic.deployment_adapters"),
        ({"traffic": {"max_retries": -1}}, "traffic.max_retries"),
        ({"objectives": {"tpot_s": 0}}, "objectives.tpot_s"),
        ({"objectives": {"min_latency_ratio": 2}}, "objectives.min_latency_ratio"),
        ({"isolation": {"hostile_adapters": 0}}, "isolation.hostile_adapters"),
        ({"price": {"name": "x", "usd_per_hour": -1, "source": "y"}}, "usd_per_hour"),
        ({"machines": 0}, "machines"),
        ({"compare": ["peft"]}, "compare"),
        ({"matrix": []}, "'matrix' must be a table"),
    ],
)
def test_bad_values_are_refused_naming_the_key(raw: dict[str, object], named: str) -> None:
    with pytest.raises(PlanError, match=named):
        plan_from_dict(raw)


def test_unreadable_plan_file_is_a_plan_error(tmp_path: Path) -> None:
    bad = tmp_path / "plan.toml"
    bad.write_text("[matrix\n", encoding="utf-8")
    with pytest.raises(PlanError, match=r"plan\.toml"):
        load_plan(bad)
    with pytest.raises(PlanError):
        load_plan(tmp_path / "missing.toml")


def _cell(active: int, popularity: str) -> Cell:
    return Cell(active, "all-8", TOKEN_SHAPES["short"], popularity)


def test_popularity_draws_follow_their_shape() -> None:
    rng = random.Random(0)
    zipf = draw_indices(_cell(256, "zipf-1.2"), 4000, rng)
    uniform = draw_indices(_cell(256, "uniform"), 4000, rng)
    assert zipf.count(0) > 10 * max(1, uniform.count(0))
    assert all(0 <= i < 256 for i in zipf + uniform)
    burst = draw_indices(_cell(48, "hot-burst"), 100, rng)
    window = burst[30:50]  # HOT_BURST_WINDOW of the run sweeps the cold adapters in order
    assert window == list(range(8, 28))
    outside = burst[:30] + burst[50:]
    assert sum(1 for i in outside if i < 8) / len(outside) > 0.6
    assert set(draw_indices(_cell(1, "hot-burst"), 20, rng)) == {0}
