"""``loraplex sim run`` / ``sim scale``: one JSON line each, bad flags refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_inputs import COST_FILE
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.cli.sim import summary
from loraplex.sim.scale import scale_run, synthetic_trace
from loraplex.sim.trace import TraceRecord, write_trace

runner = CliRunner()


def test_sim_run_on_a_workload_prints_one_json_line() -> None:
    args = ["sim", "run", "--workload", "hot-burst", "--duration-s", "5"]
    args += ["--cost-model", str(COST_FILE), "--replicas", "2", "--max-loras", "4", "--json"]
    result = runner.invoke(app, [*args, "--max-model-len", "256", "--num-kv-blocks", "300"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.strip().splitlines()
    body = json.loads(line)
    assert body["schema"] == "loraplex-sim-result/1" and body["source"] == "hot-burst"
    assert body["config"]["replicas"] == 2 and body["config"]["max_loras"] == 4
    assert (body["config"]["max_model_len"], body["config"]["num_kv_blocks"]) == (256, 300)
    assert body["metrics"]["requests"] == body["config"]["trace_requests"] > 0
    assert sum(body["metrics"]["decisions"].values()) == body["metrics"]["requests"]


def test_cold_loads_and_their_rate_count_the_same_fills() -> None:
    """``cold_loads`` (48: the acquires that reached the store) stood beside
    ``cold_loads_per_1k_requests`` (387.3: GPU-slot fills, 409, per 1,000 of 1,056 requests):
    the store's count is ``store_loads`` now, and a cold load is an L0 fill in both figures."""
    args = ["sim", "run", "--workload", "hot-burst", "--duration-s", "5", "--json"]
    body = json.loads(runner.invoke(app, [*args, "--cost-model", str(COST_FILE)]).output)
    m = body["metrics"]
    assert "cold_loads" not in m and m["l0_loads"] > 0 and m["store_loads"] > 0
    assert m["cold_loads_per_1k_requests"] == round(1000 * m["l0_loads"] / m["requests"], 1)
    assert m["store_loads"] == round(m["hit_ratio"]["L3"] * m["acquires"])  # the L3 misses


def test_sim_run_on_a_trace_file(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace([TraceRecord(0.0, "a", "x", 8, 2), TraceRecord(0.1, "a", None, 8, 2)], trace)
    args = ["sim", "run", "--trace", str(trace), "--cost-model", str(COST_FILE)]
    result = runner.invoke(app, [*args, "--eviction-policy", "lru", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["config"]["eviction_policy"] == "lru"
    assert body["metrics"]["completed"] == 2
    text = runner.invoke(app, args)  # without --json: a few summary lines
    assert text.exit_code == 0 and "requests 2  completed 2 (ratio 1)" in text.output
    assert "{" not in text.output  # figures, not the record's Python dicts


def test_an_arrival_past_the_horizon_is_refused_naming_its_line(tmp_path: Path) -> None:
    """NOTE: ``t_s`` 1e300 was simulated, exit 0: the requests there ended as
    ``QueueTimeoutError`` on a clock a step no longer moved (completed 1 of 3)."""
    trace = tmp_path / "t.jsonl"
    line = {"t_s": 0, "tenant": "a", "adapter": "x", "prompt_tokens": 8, "output_tokens": 4}
    trace.write_text(json.dumps(line) + "\n" + json.dumps({**line, "t_s": 1e300}) + "\n")
    args = ["sim", "run", "--trace", str(trace), "--cost-model", str(COST_FILE)]
    result = runner.invoke(app, args)
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and f"--trace: {trace}:2: t_s 1e+300 is invalid" in out, out


def test_the_text_summary_reads_as_figures() -> None:
    """``sim run`` without ``--json`` printed the record's dicts (``ttft_ms {'n': 2, ...}``)."""
    ttft = {"n": 4, "p50": 24.728, "p90": 52.9, "p99": 92.494}
    none = {"n": 0, "p50": None, "p90": None, "p99": None}
    metrics = {
        "requests": 5, "completed": 4, "completed_ratio": 0.8, "ttft_ms": ttft,
        "ttft_ms_warm": ttft, "ttft_ms_cold": none, "l0_loads": 2,
        "cold_loads_per_1k_requests": 400.0, "store_loads": 1,
        "hit_ratio": {"L0": 0.75, "L1": 0.0, "L2": None, "L3": 0.25},
        "throughput_tokens_per_s": 123.456, "decisions": {"gpu_hit": 3, "placement": 1},
        "imbalance": 1.3333, "refused": {},
    }  # fmt: skip
    assert summary(metrics).splitlines() == [
        "requests 5  completed 4 (ratio 0.8)",
        "ttft p50 24.7 p99 92.5 ms (n 4)  warm p50 24.7 p99 92.5 ms (n 4)  "
        "cold p50 - p99 - ms (n 0)",
        "hit ratio L0 0.75, L1 0, L2 -, L3 0.25",
        "cold loads 2 (400.0 per 1k requests)  acquires that reached the store 1",
        "throughput 123.5 tokens/s",
        "decisions gpu_hit 3, placement 1  imbalance 1.33",
    ]
    refused = {**metrics, "requests": 7, "refused": {"context_length_exceeded": 2}}
    assert summary(refused).splitlines()[0] == (
        "requests 7  completed 4 (ratio 0.8)  refused at arrival context_length_exceeded 2"
    )


def test_bad_flags_are_refused_by_name(tmp_path: Path) -> None:
    cost = ["--cost-model", str(COST_FILE)]
    uniform = ["--workload", "uniform"]
    cases = [
        (["sim", "run", *cost], "--trace/--workload"),
        (["sim", "run", *cost, "--workload", "nope"], "--workload"),
        (["sim", "run", *cost, *uniform, "--routing-policy", "x"], "--routing-policy"),
        (["sim", "run", *uniform, "--cost-model", str(tmp_path / "no")], "--cost-model"),
        (["sim", "scale", *cost, "--requests", "0"], "--requests"),
        (["sim", "run", *cost, *uniform, "--default-tenant-tier-share", "0"],
         "--default-tenant-tier-share"),
        (["sim", "run", *cost, *uniform, "--max-auto-gpu-slots", "8"], "--max-auto-gpu-slots"),
        (["sim", "run", *cost, *uniform, "--auto-warm-interval-s", "0"], "--auto-warm-interval-s"),
        (["sim", "run", *cost, *uniform, "--max-model-len", "0"], "--max-model-len"),
        (["sim", "run", *cost, *uniform, "--duration-s", "2e7"], "--duration-s"),  # > MAX_T_S
    ]  # fmt: skip
    for args, flag in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert flag in result.output, (args, result.output)


def test_each_scenario_flag_names_itself(tmp_path: Path) -> None:
    """A bad ``--duration-s`` or ``--rate`` was reported against ``--workload``, a nan or inf
    one never finished generating, and either was read by nothing beside ``--trace``."""
    trace = tmp_path / "t.jsonl"
    write_trace([TraceRecord(0.0, "a", "x", 8, 2)], trace)
    base = ["sim", "run", "--cost-model", str(COST_FILE)]
    hot = ["--workload", "hot-burst"]
    cases = [
        ([*hot, "--duration-s", "-1"], "--duration-s", "duration_s -1.0 is invalid"),
        ([*hot, "--duration-s", "nan"], "--duration-s", "duration_s nan is invalid"),
        ([*hot, "--duration-s", "inf"], "--duration-s", "duration_s inf is invalid"),
        ([*hot, "--rate", "0"], "--rate", "rate 0.0 is invalid"),
        ([*hot, "--rate", "nan"], "--rate", "rate nan is invalid"),
        ([*hot, "--rate", "inf"], "--rate", "rate inf is invalid"),
        (["--trace", str(trace), "--rate", "5"], "--rate", "a --trace keeps its times"),
        (["--trace", str(trace), "--duration-s", "60"], "--duration-s", "a --trace keeps"),
    ]
    for extra, flag, message in cases:
        refused = runner.invoke(app, [*base, *extra])
        assert refused.exit_code == 2, (extra, refused.output)
        said = refused.output
        assert f"error: {flag}: " in said and message in said, (extra, said)


def test_scale_run_reports_the_headline_key_and_peak_rss() -> None:
    from loraplex.sim.cost_model import load

    line = scale_run(300, 1000, 4, load(COST_FILE))
    assert line["sim_seconds_300_requests_1k_adapters_4_replicas"] == line["sim_wall_s"] > 0
    assert line["peak_rss_bytes"] > 0 and line["requests"] == 300
    assert line["sim_cpu_s"] > 0
    assert sum(line["decisions"].values()) == 300


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--requests", "0"], "--requests"),
        (["--adapters", "0"], "--adapters"),
        (["--replicas", "-2"], "--replicas"),
        (["--rate-per-replica", "0"], "--rate-per-replica"),
        (["--rate-per-replica", "nan"], "--rate-per-replica"),
        (["--rate-per-replica", "1e-09"], "--rate-per-replica"),  # arrivals past MAX_T_S
    ],
)
def test_sim_scale_refuses_a_bad_value_naming_its_own_flag(extra: list[str], flag: str) -> None:
    """newop: the four were named together (``--requests/--adapters/--replicas/
    --rate-per-replica: num_requests 100 / num_adapters 10 / rate -40.0 is invalid``)."""
    args = ["sim", "scale", "--requests", "50", "--adapters", "10", "--replicas", "2"]
    refused = runner.invoke(app, [*args, "--cost-model", str(COST_FILE), *extra])
    assert refused.exit_code == 2, refused.output
    assert refused.output.startswith(f"error: {flag}: {extra[1]}"), refused.output
    assert "num_requests" not in refused.output


def test_the_synthetic_trace_is_deterministic_and_skewed() -> None:
    trace = synthetic_trace(2000, 100, rate=50.0, seed=3)
    assert trace == synthetic_trace(2000, 100, rate=50.0, seed=3)
    top = sum(r.adapter == "adapter-00000" for r in trace)
    tail = sum(r.adapter == "adapter-00099" for r in trace)
    assert top > 10 * max(tail, 1)


def test_tenant_priorities_from_the_command_line() -> None:
    args = ["sim", "run", "--workload", "hot-burst", "--duration-s", "5", "--json"]
    args += ["--cost-model", str(COST_FILE), "--tenant-priority", "batch=batch"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["config"]["tenants"]["batch"]["weight"] == 0.25
    bad = runner.invoke(app, [*args[:-2], "--tenant-priority", "batch=urgent"])
    assert bad.exit_code == 2 and "--tenant-priority" in bad.output


def test_tier_share_and_warm_settings_from_the_command_line() -> None:
    args = ["sim", "run", "--workload", "hot-burst", "--duration-s", "5", "--json"]
    args += ["--cost-model", str(COST_FILE), "--default-tenant-tier-share", "1.0"]
    warm = ["--auto-warm-interval-s", "2", "--max-auto-gpu-slots", "1"]
    result = runner.invoke(app, [*args, *warm])
    assert result.exit_code == 0, result.output
    config = json.loads(result.output)["config"]
    assert config["default_tenant_tier_share"] == 1.0 and config["auto_warm"] is True
    assert (config["auto_warm_interval_s"], config["max_auto_gpu_slots"]) == (2.0, 1)
    result = runner.invoke(app, [*args, "--no-auto-warm"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["config"]["auto_warm"] is False


def test_warm_settings_with_automatic_warming_off_are_refused() -> None:
    """Only automatic promotion reads them: ``--no-auto-warm`` beside either was taken and the
    setting echoed in the run's config while nothing used it."""
    args = ["sim", "run", "--workload", "hot-burst", "--duration-s", "5", "--json"]
    args += ["--cost-model", str(COST_FILE), "--no-auto-warm"]
    for flag, value in (("--max-auto-gpu-slots", "1"), ("--auto-warm-interval-s", "2")):
        result = runner.invoke(app, [*args, flag, value])
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.replace("│", " ").split())
        assert f"{flag[2:].replace('-', '_')} " in said and "while auto_warm is off" in said


def test_a_fleet_topology_from_the_command_line() -> None:
    """``--topology`` (and ``--topology-set KEY=NUMBER``) sets ``SimConfig.topology``, which
    was settable only from code; a topology that would do nothing is refused by name."""
    args = ["sim", "run", "--workload", "hot-one", "--duration-s", "20", "--rate", "30"]
    args += ["--cost-model", str(COST_FILE), "--replicas", "3", "--max-loras", "3", "--json"]
    result = runner.invoke(app, [*args, "--topology", "--topology-set", "window_s=5"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["config"]["topology"]["window_s"] == 5.0
    assert body["config"]["topology"]["min_requests"] == 16  # the rest: TopologyConfig's
    assert body["metrics"]["decisions"].get("merged", 0) > 0  # a replica got the hot revision
    plain = json.loads(runner.invoke(app, args).output)
    assert plain["config"]["topology"] is None and "merged" not in plain["metrics"]["decisions"]
    cases = [
        (["--topology-set", "window_s=5"], "--topology-set", "without --topology"),
        (["--topology", "--topology-set", "colour=5"], "--topology-set", "KEY one of"),
        (["--topology", "--topology-set", "min_requests=2.5"], "--topology-set", "an integer"),
        (["--topology", "--topology-set", "release_demand=2"], "--topology-set",
         "release_demand 2.0 is invalid"),
        (["--topology", "--replicas", "1"], "--topology/--replicas", "min_replicas 2"),
        (["--topology", "--routing-policy", "pow2"], "--topology/--routing-policy",
         "does not send a dedicated revision's traffic"),
    ]  # fmt: skip
    for extra, flag, message in cases:
        refused = runner.invoke(app, [*args, *extra])
        assert refused.exit_code == 2, (extra, refused.output)
        assert f"error: {flag}: " in refused.output and message in refused.output, refused.output


@pytest.mark.parametrize(
    ("command", "extra", "flag"),
    [
        ("calibrate", ["--revisions", "0"], "--revisions"),
        ("calibrate", ["--batch-sizes", "0,2"], "--batch-sizes"),
        ("calibrate", ["--output-tokens", "2"], "--output-tokens"),
        ("calibrate", ["--prefill-lengths", "8,-1"], "--prefill-lengths"),
        ("calibrate", ["--repeats", "0"], "--repeats"),
        ("calibrate-fleet", ["--replicas", "1"], "--replicas"),
        ("calibrate-fleet", ["--cold-requests", "2"], "--cold-requests"),
        ("calibrate-fleet", ["--in-flight", "2,4"], "--in-flight"),
        ("calibrate-fleet", ["--contention-rounds", "0"], "--contention-rounds"),
        ("calibrate-fleet", ["--base", "absent.json"], "--base"),
    ],
)
def test_calibrate_refuses_a_bad_value_naming_its_flag(
    tmp_path: Path, command: str, extra: list[str], flag: str
) -> None:
    """newop: these were ``Invalid value:`` and the config field's name (``revision_counts
    (0,) is invalid`` for --revisions), or a bare ``[Errno 2]`` for --base; nothing started."""
    if command == "calibrate":
        args = ["sim", "calibrate", "--self", "--hardware", "h", "--out", str(tmp_path / "c")]
    else:
        args = ["sim", "calibrate-fleet", "--base", str(COST_FILE), "--out", str(tmp_path / "c")]
    refused = runner.invoke(app, [*args, *extra])
    out = " ".join(refused.output.replace("│", " ").split())
    assert refused.exit_code == 2 and f"Invalid value for {flag}:" in out, out
    assert not any(tmp_path.iterdir())


def test_sim_run_refuses_an_empty_trace_naming_it(tmp_path: Path) -> None:
    """newop: an empty trace simulated as 0 requests, every figure undefined, exit 0."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = ["sim", "run", "--trace", str(empty), "--cost-model", str(COST_FILE), "--json"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2, refused.output
    assert refused.output.startswith(f"error: --trace: {empty} holds no request"), refused.output


def test_a_calibrate_refusal_names_a_flag_only_for_a_field_of_the_config() -> None:
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.cli.sim_calibrate import flag_of_field

    def flag(message: str) -> str | None:
        return flag_of_field(ValueError(message), CalibrateConfig)

    assert flag("revision_counts (0,) is invalid; expected >= 1") == "--revisions"
    assert flag("batch_sizes (0, 2) is invalid") == "--batch-sizes"
    # a message that starts with no field of the config names no flag (it named "--expected")
    assert flag("expected at least one batch size") is None
    assert flag("") is None


def test_sim_run_takes_the_served_max_lora_rank(tmp_path: Path) -> None:
    """A request log of a server with ``max_lora_rank = 128`` names rank-128 adapters; ``sim
    run`` had no flag for the rank and refused them (newop4). Below the default rank, the
    default follows it (it was ``--options: default_rank 16 is invalid``)."""
    path = tmp_path / "t.jsonl"
    line = {"t_s": 0.0, "tenant": "t", "adapter": "a", "prompt_tokens": 8, "output_tokens": 4}
    path.write_text(json.dumps({**line, "rank": 128}) + "\n")
    args = ["sim", "run", "--trace", str(path), "--cost-model", str(COST_FILE), "--json"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "max_lora_rank 64" in refused.output
    taken = runner.invoke(app, [*args, "--max-lora-rank", "128"])
    assert taken.exit_code == 0, taken.output
    assert json.loads(taken.output)["metrics"]["completed"] == 1
    path.write_text(json.dumps(line) + "\n")  # no rank: the default, held to the flag
    small = runner.invoke(app, [*args, "--max-lora-rank", "8"])
    assert small.exit_code == 0, small.output


def test_a_log_across_the_shape_upgrade_replays_each_adapter_at_its_given_shape(
    tmp_path: Path,
) -> None:
    """A request log written before and after its lines carried ``rank``/``size_bytes`` holds
    both kinds for one revision; the shapeless lines take the given shape (they were the
    default rank, and the two were refused as two shapes). Two given shapes still are."""
    path = tmp_path / "t.jsonl"
    line = {"t_s": 0.0, "tenant": "t", "adapter": "a@r1", "prompt_tokens": 8, "output_tokens": 4}
    shaped = {**line, "t_s": 1.0, "rank": 8, "size_bytes": 212992}
    path.write_text(json.dumps(line) + "\n" + json.dumps(shaped) + "\n")
    args = ["sim", "run", "--trace", str(path), "--cost-model", str(COST_FILE), "--json"]
    taken = runner.invoke(app, args)
    assert taken.exit_code == 0, taken.output
    assert json.loads(taken.output)["metrics"]["completed"] == 2
    other = {**shaped, "t_s": 2.0, "rank": 16}
    path.write_text("\n".join(json.dumps(x) for x in (line, shaped, other)) + "\n")
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "two shapes" in refused.output
