"""The simulated fleet takes the fleet's ``router`` table (``SimConfig.router``, ``sim run
--router``, ``plan --router``): RouterConfig overrides, refused as ``[fleet] router`` refuses
them. Before, the simulator had no way to set one, so a fleet's ``max_queued`` or
``spread_after_s`` could not be simulated (satsweep)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_inputs import COST_FILE, cost
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

runner = CliRunner()


def _decisions(router: dict[str, int]) -> dict[str, int]:
    """Six long requests of one revision, 10 ms apart, no report after the first: each is
    still running when the next arrives, so each is its replica's routed load."""
    trace = [TraceRecord(0.01 * i, "acme", "support", 8, 200) for i in range(6)]
    config = SimConfig(replicas=3, max_loras=4, report_interval_s=100.0, router=router)
    metrics = simulate(trace, config, cost()).metrics
    assert metrics["completed_ratio"] == 1.0
    return dict(metrics["decisions"])


def test_the_router_table_reaches_the_simulated_router() -> None:
    """With the defaults (``max_queued`` 8) six routed requests never saturate the holder; with
    ``max_queued`` 2 the third finds it saturated and goes elsewhere."""
    assert _decisions({}) == {"placement": 6}
    saturated = _decisions({"max_queued": 2})
    assert saturated.get("saturated", 0) > 0, saturated


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"router": {"colour": 1}}, r"router keys \['colour'\] are unknown; expected some of"),
        ({"router": {"max_queued": 0}}, "max_queued 0 is invalid"),
        ({"router": [("max_queued", 2)]}, "router .* is invalid; expected a table"),
        (
            {"router": {"max_queued": 2}, "routing_policy": "pow2"},
            r"router keys \['max_queued'\] are not read by the routing policy 'pow2'",
        ),
        ({"router": {"max_queued": 2}, "replicas": 1}, "router is set with replicas 1"),
    ],
)
def test_a_bad_router_table_is_refused_as_the_fleet_refuses_it(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**{"replicas": 3, **settings})  # type: ignore[arg-type]


def _sim(*extra: str) -> tuple[int, str]:
    args = ["sim", "run", "--workload", "hot-burst", "--duration-s", "2", "--json"]
    args += ["--cost-model", str(COST_FILE), "--max-loras", "4", *extra]
    result = runner.invoke(app, args)
    return result.exit_code, result.output


def test_sim_run_takes_the_router_table() -> None:
    code, output = _sim(
        "--replicas", "3", "--router", "max_queued=4", "--router", "narrow_below=0.25"
    )
    assert code == 0, output
    body = json.loads(output)
    assert body["config"]["router"] == {"max_queued": 4, "narrow_below": 0.25}


@pytest.mark.parametrize(
    ("extra", "flag", "words"),
    [
        (["--replicas", "3", "--router", "colour=1"], "--router", "['colour'] are unknown"),
        (["--replicas", "3", "--router", "max_queued=2.5"], "--router", "expected an integer"),
        (["--replicas", "3", "--router", "max_queued"], "--router", "expected KEY=NUMBER"),
        (["--replicas", "3", "--router", "max_ongoing=0"], "--router", "max_ongoing 0"),
        (
            ["--replicas", "3", "--routing-policy", "pow2", "--router", "max_queued=2"],
            "--router",
            "not read by the routing policy 'pow2'",
        ),
        (["--router", "max_queued=2"], "--router/--replicas", "router is set with replicas 1"),
        (["--routing-policy", "x", "--router", "max_queued=2"], "--routing-policy", "'x'"),
    ],
)
def test_sim_run_refuses_a_bad_router_pair_naming_it(
    extra: list[str], flag: str, words: str
) -> None:
    code, output = _sim(*extra)
    text = " ".join(output.split())
    assert code == 2, output
    assert f"error: {flag}:" in text and words in text, text


def _plan(tmp_path: Path, *extra: str) -> tuple[int, str]:
    line = {"t_s": 0.0, "tenant": "t", "adapter": "a", "prompt_tokens": 8, "output_tokens": 4}
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(line) + "\n" + json.dumps({**line, "t_s": 0.5}) + "\n")
    args = ["plan", "--trace", str(trace), "--slo", "ttft_p99<=500ms"]
    args += ["--hardware", "h100-sxm-llama2-7b-bf16", "--replicas", "1,2", "--max-loras", "4"]
    args += ["--cpu-bytes", "64MiB", "--eviction", "lru", "--json", *extra]
    result = runner.invoke(app, args)
    return result.exit_code, result.output


def test_plan_takes_the_router_table_for_its_routed_candidates(tmp_path: Path) -> None:
    extra = ["--routing", "affinity_until_saturated", "--router", "max_queued=4"]
    code, output = _plan(tmp_path, *extra)
    assert code == 0, output
    record = json.loads(output.strip().splitlines()[-1])
    assert record["router"] == {"max_queued": 4}
    assert record["candidates"] == 2  # one replica (moot there) and two, routed with it


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--router", "max_queued=4"], "not read by the routing policy 'pow2'"),  # default routing
        (["--routing", "affinity_until_saturated", "--router", "colour=1"], "['colour']"),
    ],
)
def test_plan_refuses_a_router_table_naming_the_flag(
    tmp_path: Path, extra: list[str], words: str
) -> None:
    code, output = _plan(tmp_path, *extra)
    text = " ".join(output.split())
    assert code == 2, output
    assert "--router" in text and words in text, text
