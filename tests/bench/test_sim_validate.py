"""The real side's reductions (records and counters to outcomes), the simulated side's config,
the workload rows, and the `bench sim` / `sim calibrate` / `plan` command-line checks."""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import fields, replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import httpx
import pytest
import typer
from local_http import local_server
from typer.testing import CliRunner

from loraplex.bench.serve import driver
from loraplex.bench.serve.driver import DriveConfig, RequestRecord
from loraplex.bench.serve.fleet import STORM_COLD_LOADS
from loraplex.bench.sim.bench import prepared
from loraplex.bench.sim.calibrate_cold import ColdSample, handoff_seconds
from loraplex.bench.sim.calibrate_run import CalibrateConfig, mixes, weight_regressors
from loraplex.bench.sim.calibrate_target import ServedAdapter
from loraplex.bench.sim.compare import OUTCOME_KEYS, check_outcome
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.simulated import adapter_sizes, registry_tenants, sim_config
from loraplex.bench.sim.traces import workload_rows
from loraplex.bench.sim.validate import (
    RealSettings,
    fleet_cache_outcome,
    request_outcome,
)
from loraplex.bench.workloads import ScenarioParams, TraceRequest, generate
from loraplex.cli import app
from loraplex.cli.sim_calibrate import _redacted, register_calibrate
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.errors import ContextLengthError
from loraplex.residency.ledger import Tier
from loraplex.sampling import check_prompt_room
from loraplex.server.errors import context_error
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import load as load_cost
from loraplex.sim.refusal import CONTEXT_CODE
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

_COST_EXAMPLE = Path(__file__).resolve().parents[1] / "sim" / "cost_example.json"


def _flat(output: str) -> str:
    """The CLI's message without rich's box drawing and line wrapping."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


def _record(t_s: float, ttft: float | None, status: int = 200, tokens: int = 5) -> RequestRecord:
    return RequestRecord(
        t_s, "a", "x", "L0", status, ttft, 0.01 if ttft is not None else None, tokens, "r1",
        None if status == 200 else "boom", None if status == 0 else 0.001,
    )  # fmt: skip


def test_request_outcome_counts_failures_at_the_timeout_and_spans_the_makespan() -> None:
    records = [_record(0.0, 0.1), _record(1.0, 0.2), _record(2.0, None, status=503)]
    out = request_outcome(records, timeout_s=10.0)
    assert out["completed"] == 2 and out["completed_ratio"] == pytest.approx(0.6667)
    assert out["ttft_ms"]["p99"] == pytest.approx(10_000.0, rel=0.01)  # the failure
    # Last end: the 503 replied at 2.001; the second request ended at 1.0 + 0.2 + 4 x 0.01.
    assert out["makespan_s"] == pytest.approx(2.001)
    assert out["throughput_requests_per_s"] == pytest.approx(2 / 2.001, rel=1e-3)
    assert request_outcome([], 1.0)["throughput_requests_per_s"] is None
    # Warm / cold by the tier at arrival: all three arrived at L0 here; a cold one moves.
    assert out["ttft_ms_warm"] == out["ttft_ms"] and out["ttft_ms_cold"]["p50"] is None
    cold = replace(records[0], tier="L3", ttft_s=0.5)
    split = request_outcome([cold, *records[1:]], timeout_s=10.0)
    assert split["ttft_ms_cold"]["p50"] == pytest.approx(500.0)
    assert split["ttft_ms_warm"]["p99"] == pytest.approx(10_000.0, rel=0.01)  # the failure


def test_a_400_is_refused_and_in_no_percentile_as_the_simulator_counts_it() -> None:
    """The server refuses a request it can never serve before queueing it (a 400: a prompt
    beyond the context, ``sim/refusal.py``); the simulator refuses it at arrival and times it
    in no percentile, so the real side leaves it out too. Load failures (503, no reply) stay
    in at the timeout; every request stays in ``requests`` and the completed ratio."""
    served = [_record(0.0, 0.1), _record(1.0, 0.2), _record(2.0, None, status=503)]
    refused = [_record(0.5, None, status=400), _record(1.5, None, status=400)]
    out = request_outcome(sorted(served + refused, key=lambda r: r.t_s), timeout_s=10.0)
    alone = request_outcome(served, timeout_s=10.0)
    for key in ("ttft_ms", "ttft_ms_warm", "ttft_ms_cold"):
        assert out[key] == alone[key], key
    assert out["ttft_ms"]["p99"] == pytest.approx(10_000.0, rel=0.01)  # the 503
    assert (out["refused"], alone["refused"]) == ({"400": 2}, {})  # no code: the status
    assert (out["requests"], out["completed"]) == (5, 2)
    assert out["completed_ratio"] == pytest.approx(0.4)


def test_refused_is_keyed_by_the_error_code_on_both_sides() -> None:
    """The real side keyed ``refused`` by status (``{"400": 1}``) where the simulator keys it by
    the server's error code (``{"context_length_exceeded": 1}``): one ``bench sim`` line held
    the same requests under two keys. The driver reads the code from the 400's body (the
    server's own ``context_error``), and both sides key by it."""
    with pytest.raises(ContextLengthError) as refused_here:
        check_prompt_room(600, 512)
    body = json.dumps(context_error(refused_here.value).body()).encode()

    class Refusing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    request = TraceRequest(0.0, "t", "a0", 600, 8)
    with local_server(Refusing) as url:
        record = asyncio.run(
            driver.send_one(url, request, key="k", ids=[5] * 600, arrival=time.monotonic(),
                     tier="L0", config=DriveConfig(request_timeout_s=5.0))
        )  # fmt: skip
    assert (record.status, record.code) == (400, CONTEXT_CODE)
    real = request_outcome([record, _record(0.5, 0.1)], timeout_s=5.0)["refused"]
    config = SimConfig(max_model_len=512)
    trace = [TraceRecord(0.0, "t", "a0", 600, 8), TraceRecord(0.5, "t", "a0", 32, 8)]
    simulated = simulate(trace, config, load_cost(_COST_EXAMPLE)).metrics["refused"]
    assert real == simulated == {CONTEXT_CODE: 1}
    assert (
        driver.error_code({"error": {"code": "x" * 65}}) is None
    )  # not a code: the status keys it
    assert driver.error_code([]) is None and driver.error_code({"error": "boom"}) is None


def test_fleet_statuses_sum_into_per_tier_hit_ratios() -> None:
    def status(l0: int, l1: int, l2: int, miss: int, loads: int) -> dict[str, object]:
        stats = SimpleNamespace(loads={Tier.L0: loads})
        return {"hits": {"l0": l0, "l1": l1, "l2": l2, "miss": miss},
                "summary": SimpleNamespace(stats=stats)}  # fmt: skip

    out = fleet_cache_outcome([status(6, 1, 0, 1, 3), status(2, 1, 1, 0, 2)])
    assert out["hit_ratio"] == {"L0": 0.6667, "L1": 0.1667, "L2": 0.0833, "L3": 0.0833}
    assert out["l0_loads"] == 5
    empty = fleet_cache_outcome([])
    assert empty["hit_ratio"] == {"L0": None, "L1": None, "L2": None, "L3": None}


def test_real_and_simulated_outcomes_carry_the_compared_keys() -> None:
    outcome = request_outcome([_record(0.0, 0.1)], 5.0)
    outcome.update(fleet_cache_outcome([]))
    check_outcome(outcome, "real")
    assert set(OUTCOME_KEYS) <= set(outcome)


def test_the_simulated_config_mirrors_the_real_settings(tmp_path: Path) -> None:
    config = SimBenchConfig(settings=RealSettings(max_loras=5, replicas=3, request_timeout_s=20))
    tenants = {"batch": TenantSettings.for_priority("batch")}
    single, fleet = (sim_config(config, t, 1024, tenants) for t in ("single", "fleet"))
    assert single["replicas"] == 1 and fleet["replicas"] == 3
    assert single["max_loras"] == 5 and single["queue_deadline_s"] == 10.0
    assert single["timeout_s"] == 20 and single["eviction_policy"] == "cost_aware"
    assert single["tenants"] == tenants
    # The server's defaults where the simulator's own differ.
    assert (single["max_model_len"], single["num_kv_blocks"]) == (512, 1024)
    SimConfig(**single)  # every field is one the simulator takes


def test_the_simulated_tenants_are_the_registrys_as_the_server_reads_them(
    tmp_path: Path,
    demo_assets,  # type: ignore[no-untyped-def]
) -> None:
    """cold-storm's tenants: the storm tenant is in the batch class with its slot and cold-load
    quotas, the steady ones are normal: the settings a server on that registry enforces."""
    workload = generate("cold-storm", 0, ScenarioParams(duration_s=2, rate=2, num_adapters=2))
    config = SimBenchConfig(traces=("cold-storm",), trace_requests=4, num_adapters=2)
    registry = prepared(config, [workload], tmp_path, demo_assets.base_model_dir)
    tenants = registry_tenants(registry)
    assert set(tenants) == {a.tenant for a in workload.adapters}
    storm = tenants["storm"]
    assert storm.weight == TenantSettings.for_priority("batch").weight
    assert storm.max_cold_loads == STORM_COLD_LOADS and storm.max_gpu_bytes is not None
    assert all(s.weight == 1.0 and s.max_gpu_bytes is None for t, s in tenants.items()
               if t != "storm")  # fmt: skip


def test_adapter_sizes_follow_rank_and_targets(demo_assets) -> None:  # type: ignore[no-untyped-def]
    workload = generate("zipf-longtail", 0, ScenarioParams(duration_s=5, rate=4, num_adapters=8))
    sizes, per_rank = adapter_sizes(demo_assets.base_model_dir, list(workload.adapters))
    for a in workload.adapters:
        assert sizes[(a.tenant, a.name)] > 0
    ranked = sorted(workload.adapters, key=lambda a: (len(a.targets), a.rank))
    assert sizes[(ranked[0].tenant, ranked[0].name)] <= sizes[(ranked[-1].tenant, ranked[-1].name)]
    assert per_rank > 0


def test_workload_rows_cap_ranks_and_attach_sizes() -> None:
    workload = generate("hot-burst", 0, ScenarioParams(duration_s=5, rate=4))
    sizes = {(a.tenant, a.name): 100 for a in workload.adapters}
    rows = workload_rows(workload, 32, sizes)
    assert len(rows) == len(workload.requests)
    assert all(r["rank"] <= 32 and r["size_bytes"] == 100 for r in rows)
    assert set(rows[0]) == {"t_s", "tenant", "adapter", "prompt_tokens", "output_tokens",
                            "rank", "size_bytes"}  # fmt: skip


def test_calibration_mixes_vary_revisions_and_rank_tokens_apart() -> None:
    adapters = [ServedAdapter("t", f"a{r}", "r1", r) for r in (8, 16, 32, 64)]
    config = CalibrateConfig(batch_sizes=(1, 4), revision_counts=(1, 2))
    got = mixes(adapters, config)
    # batch 1: one revision, low and high rank; batch 4: 1 and 2 revisions, low and high.
    assert [(b, tuple(a.rank for a in c)) for b, c in got] == [
        (1, (8,)), (1, (64,)), (4, (8,)), (4, (64,)), (4, (8, 16)), (4, (32, 64)),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="output_tokens"):
        CalibrateConfig(output_tokens=2)
    with pytest.raises(ValueError, match="batch_sizes"):
        CalibrateConfig(batch_sizes=())
    with pytest.raises(ValueError, match="prefill_lengths"):
        CalibrateConfig(prefill_lengths=())


def test_calibration_mixes_cover_each_target_set_and_both_in_one_step() -> None:
    """Attention-only (1,000 bytes per rank) and all-linear (3,000) adapters: each set's low
    and high ranks, and the two sets' lowest ranks together, so bytes vary apart from rank."""
    adapters = [
        ServedAdapter("t", f"{kind}{r}", "r1", r, width * r)
        for kind, width in (("all", 3000), ("attn", 1000))
        for r in (8, 64)
    ]
    got = mixes(adapters, CalibrateConfig(batch_sizes=(1, 2), revision_counts=(1,)))
    assert [(b, tuple(a.name for a in c)) for b, c in got] == [
        (1, ("attn8",)), (1, ("attn64",)), (1, ("all8",)), (1, ("all64",)),
        (2, ("attn8",)), (2, ("attn64",)), (2, ("all8",)), (2, ("all64",)), (2, ("attn8", "all8")),
    ]  # fmt: skip
    attn8, all8 = adapters[2], adapters[0]
    # three tokens (two of attn8), two distinct revisions
    assert weight_regressors((attn8, attn8, all8)) == (2 * 8000 + 24000, 4000.0)
    assert weight_regressors((ServedAdapter("t", "x", "r1", 8),)) == (0, 0.0)  # size unknown


def test_the_cold_handoff_is_what_neither_the_warm_ttft_nor_the_stages_explain() -> None:
    samples = [
        ColdSample("t/a@r1", cold_ttft_s=0.060, warm_ttft_s=0.020, stage_s=0.025),  # 15 ms
        ColdSample("t/b@r1", cold_ttft_s=0.050, warm_ttft_s=0.020, stage_s=0.020),  # 10 ms
        ColdSample("t/c@r1", cold_ttft_s=0.090, warm_ttft_s=0.020, stage_s=0.030),  # 40 ms
    ]
    assert samples[0].handoff_s == pytest.approx(0.015)
    assert handoff_seconds(samples) == pytest.approx(0.015)  # the median
    faster = [ColdSample("t/a@r1", 0.030, 0.020, 0.015)]  # stages overlapped the warm path
    assert handoff_seconds(faster) == 0.0 and handoff_seconds([]) == 0.0


def test_the_recorded_command_hides_the_admin_key() -> None:
    assert _redacted(["--url", "u", "--admin-key", "secret", "--out", "f"]) == [
        "--url", "u", "--admin-key", "<redacted>", "--out", "f"
    ]  # fmt: skip
    assert _redacted(["--admin-key=secret"]) == ["--admin-key=<redacted>"]


def _sim_group() -> typer.Typer:
    group = typer.Typer()

    @group.callback()
    def _root() -> None:
        """sim"""

    register_calibrate(group)
    return group


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "o.json", "--hardware", "h"], "exactly one of --url and --self"),
        (["--out", "o.json", "--hardware", "h", "--self", "--url", "http://x"], "exactly one"),
        (["--out", "o.json", "--hardware", "h", "--url", "http://x"], "no --admin-key and no "),
        (["--out", "o.json", "--hardware", "h", "--self", "--admin-key", "k"], "no --admin-key"),
        (["--out", "o.json", "--hardware", "h", "--self", "--data-dir", "d"], "no --data-dir"),
        (["--out", "o.json", "--hardware", " ", "--self"], "--hardware"),
        (["--out", "o.json", "--hardware", "h", "--self", "--output-tokens", "2"], "output_tokens"),
        (["--out", "o.json", "--hardware", "h", "--self", "--batch-sizes", "1,x"], "integers"),
        (
            ["--out", "o.json", "--hardware", "h", "--self", "--prefill-lengths", "8,0"],
            "prefill_lengths",
        ),
        (["--out", "o.json", "--hardware", "h", "--self", "--prefill-lengths", "8,x"], "integers"),
        (["--out", "o.json", "--hardware", "h", "--self", "--target-sets", "attn,mlp"], "--target"),
        (["--out", "o.json", "--hardware", "h", "--self", "--target-sets", "all,all"], "distinct"),
        (
            ["--out", "o.json", "--hardware", "h", "--url", "http://x", "--target-sets", "attn"],
            "--target-sets is for --self",
        ),
        (
            ["--out", "o.json", "--hardware", "h", "--url", "http://x", "--max-loras", "4"],
            "--max-loras is for --self; --url does not use it",
        ),
        (
            ["--out", "o.json", "--hardware", "h", "--url", "http://x", "--asset-dir", "a"],
            "--asset-dir is for --self",
        ),
        (
            ["--out", "o.json", "--hardware", "h", "--self", "--max-adapters", "4"],
            "--max-adapters is for --url; --self does not use it",
        ),
    ],
)
def test_calibrate_options_are_checked_before_anything_runs(
    tmp_path: Path, args: list[str], message: str
) -> None:
    env = {"LORAPLEX_ADMIN_KEY": "", "LORAPLEX_DATA_DIR": str(tmp_path)}  # no admin-key file
    result = CliRunner().invoke(_sim_group(), ["calibrate", *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)


def test_calibrate_a_401_with_the_key_file_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE: a refused admin call ended in a traceback, with no word of the key's source."""

    def _refused(url: str, *args: object, **kwargs: object) -> NoReturn:
        request = httpx.Request("GET", f"{url}/admin/adapters")
        response = httpx.Response(401, request=request)
        raise httpx.HTTPStatusError("401", request=request, response=response)

    monkeypatch.setattr("loraplex.bench.sim.calibrate_target.remote_target", _refused)
    (tmp_path / "admin-key").write_text("lpxadmin_" + "o" * 40 + "\n", encoding="utf-8")
    args = ["calibrate", "--out", "o.json", "--hardware", "h", "--url", "http://x"]
    env = {"LORAPLEX_ADMIN_KEY": "", "LORAPLEX_DATA_DIR": str(tmp_path)}
    result = CliRunner().invoke(_sim_group(), args, env=env)
    assert result.exit_code == 2, result.output
    out = _flat(result.output)
    assert "GET /admin/adapters -> 401" in out
    assert f"the admin key was read from {tmp_path / 'admin-key'}" in out


_EXAMPLE_COST = Path(__file__).resolve().parents[1] / "sim" / "cost_example.json"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--traces", "drift"], "traces"),
        (["--targets", "cluster"], "targets"),
        (["--rate", "0"], "rate"),
        (["--repeats", "0"], "repeats 0 is invalid"),
        (["--cost-model", "/nonexistent.json"], "nonexistent"),
        (["--cost-model", str(_EXAMPLE_COST), "--calibrated-out", "c.json"], "--calibrated-out"),
        (["--cost-model", str(_EXAMPLE_COST), "--hardware", "h"], "--hardware is for the in-run"),
        (["--hardware", " "], "--hardware must name"),
        (
            [
                "--cost-model",
                str(_EXAMPLE_COST),
                "--calibrate-interleaved",
                "2",
                "--targets",
                "single",
            ],
            "calibrate_interleaved 2 is invalid with cost_model",
        ),
        (
            [
                "--cost-model",
                str(_EXAMPLE_COST),
                "--calibrate-interleaved",
                "2",
                "--targets",
                "fleet",
            ],
            "both targets are needed",
        ),
        (["--calibrate-interleaved", "-1"], "calibrate_interleaved -1 is invalid"),
        (["--fleet-id-draws", "-1"], "fleet_id_draws -1 is invalid"),
        (["--fleet-id-draws", "257"], "fleet_id_draws 257 is invalid"),
    ],
)
def test_bench_sim_options_are_checked(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["bench", "sim", "--json", *args])
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"t_s": 0.0, "tenant": "a", "adapter": "x", "prompt_tokens": 4,
                                "output_tokens": 2}) + "\n")  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slo", "ttft_p99<500"], "malformed"),
        (["--hardware", "tpu-v9"], "tpu-v9"),
        (["--eviction", "fifo"], "fifo"),
        (["--routing", "random"], "random"),
        (["--cpu-bytes", "lots"], "no size"),
        (["--replicas", "0"], "replicas"),
        (["--merged-replicas", "1"], "merged replicas"),
        (["--bytes-per-rank", "0"], "--bytes-per-rank"),
        (["--usd-per-hour", "3"], "--price-source"),
        (["--price-source", "x"], "only read with --usd-per-hour"),
        (["--cost-tolerance", "-0.5"], "--cost-tolerance -0.5 is invalid"),
        (["--cost-tolerance", "nan"], "--cost-tolerance nan is invalid"),
    ],
)
def test_plan_options_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    base = {"--trace": str(_trace(tmp_path)), "--slo": "ttft_p99<=500ms",
            "--hardware": "h100-sxm-llama2-7b-bf16"}  # fmt: skip
    given = dict(zip(args[::2], args[1::2], strict=True))
    argv = [item for k, v in {**base, **given}.items() for item in (k, v)]
    result = CliRunner().invoke(app, ["plan", "--json", *argv])
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)


def test_the_simulator_core_is_called() -> None:
    from loraplex.sim.call import records, simulate_metrics
    from loraplex.sim.profiles import load_profile

    workload = generate("zipf-longtail", 0, ScenarioParams(duration_s=4, rate=4, num_adapters=8))
    metrics = simulate_metrics(
        records(workload_rows(workload, 64)),
        {"max_loras": 2},
        load_profile("h100-sxm-llama2-7b-bf16"),
    )
    check_outcome(metrics, "sim")
    assert metrics["completed"] >= 1 and metrics["makespan_s"] > 0


def test_plan_end_to_end_on_the_simulator(tmp_path: Path) -> None:
    workload = generate("zipf-longtail", 0, ScenarioParams(duration_s=6, rate=6, num_adapters=16))
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in workload_rows(workload, 64)))
    argv = ["plan", "--json", "--trace", str(trace), "--slo", "completed_ratio>=0.99",
            "--hardware", "h100-sxm-llama2-7b-bf16", "--replicas", "1,2", "--max-loras", "2,8",
            "--cpu-bytes", "64MiB", "--eviction", "lru", "--routing", "pow2"]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["candidates"] == 4 and line["best"] is not None
    assert line["best"]["config"]["replicas"] == 1  # one machine is cheaper when both complete
    assert line["cost_tolerance"] == 0.0 and len(line["swept"]) == 4


def test_the_scale_run_happens_in_a_child_and_reports_its_own_peak_rss() -> None:
    from loraplex.bench.sim.scale import scale_in_child
    from loraplex.sim.profiles import load_profile

    model = load_profile("h100-sxm-llama2-7b-bf16")
    out = scale_in_child(200, 10, 2, model)
    assert out["sim_seconds_200_requests_10_adapters_2_replicas"] > 0
    assert out["scale_requests"] == 200 and out["scale_peak_rss_bytes"] > 0


def test_a_run_may_turn_the_servers_request_log_on(tmp_path: Path) -> None:
    """``ServerOptions.request_log_path`` reaches the server's settings (``sim calibrate
    --self`` reads the engine's timelines there); unset, the key is not written."""
    from loraplex.bench.serve.fleet import Fleet, ServerOptions, serve_values
    from loraplex.serve.config import ServeConfig

    fleet = Fleet(tmp_path, tmp_path / "model", {"t": "k"}, "admin", 64)
    log = tmp_path / "requests.jsonl"
    values = serve_values(
        fleet, tmp_path, ServerOptions("lru", 2, 1 << 20, request_log_path=log), 1
    )
    assert values["request_log_path"] == str(log)
    assert "request_log_path" in {f.name for f in fields(ServeConfig)}
    assert "request_log_path" not in serve_values(fleet, tmp_path, ServerOptions("lru", 2, 1), 1)


def test_bench_sim_refuses_a_logs_dir_that_holds_files(tmp_path: Path) -> None:
    """Its files would be overwritten: refused by name, before anything runs."""
    (tmp_path / "old.jsonl").write_text("{}\n")
    args = ["bench", "sim", "--json", "--cost-model", str(_EXAMPLE_COST), "--logs-dir"]
    result = CliRunner().invoke(app, [*args, str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--logs-dir" in _flat(result.output) and "new or empty directory" in _flat(result.output)


def test_bench_sim_runs_a_file_with_single_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """--cost-model with --calibrate-interleaved (both targets): the run gets the file's model
    and the passes (named by --hardware, which the passes' models carry); nothing runs here."""
    from loraplex.bench.sim import bench

    seen: dict[str, object] = {}

    def run_sim_bench(config: SimBenchConfig, model: object, interleaved: object, fleet: object):
        seen.update(config=config, model=model, interleaved=interleaved, fleet=fleet)
        return {"metrics": {"cost_model": {}}}

    monkeypatch.setattr(bench, "run_sim_bench", run_sim_bench)
    args = ["--cost-model", str(_EXAMPLE_COST), "--calibrate-interleaved", "3", "--hardware", "h"]
    result = CliRunner().invoke(app, ["bench", "sim", "--json", *args])
    assert result.exit_code == 0, result.output
    interleaved: Any = seen["interleaved"]
    assert (interleaved.fraction, interleaved.hardware) == (3, "h")
    assert getattr(seen["model"], "hardware", None) is not None  # the file's
    assert seen["fleet"] is None


def test_a_relative_logs_dir_reaches_the_run_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The servers write their request logs from their own working directories: a relative
    ``--logs-dir`` (read from the caller's) reaches the run absolute. A serve child was refused
    with "request_log_path ... its directory does not exist" in a hold with ``--logs-dir logs``."""
    from loraplex.bench.sim import bench

    seen: dict[str, Any] = {}

    def run_sim_bench(config: SimBenchConfig, *_: object) -> dict[str, Any]:
        seen["config"] = config
        return {"metrics": {"cost_model": {}}}

    monkeypatch.setattr(bench, "run_sim_bench", run_sim_bench)
    monkeypatch.chdir(tmp_path)
    args = ["--cost-model", str(_EXAMPLE_COST), "--logs-dir", "logs"]
    result = CliRunner().invoke(app, ["bench", "sim", "--json", *args])
    assert result.exit_code == 0, result.output
    assert seen["config"].logs_dir == tmp_path / "logs"
    assert (tmp_path / "logs").is_dir()


def test_a_run_keeps_the_clients_records_beside_the_servers_log(tmp_path: Path) -> None:
    """``RunLogs`` names both files of a run; the client's records round-trip as JSONL in
    trace order, so a request pairs with the server's line and the simulator's outcome."""
    from loraplex.bench.sim.validate import RunLogs, write_client_records

    logs = RunLogs.under(tmp_path, "single-r0-hot-burst")
    assert logs.server == tmp_path / "single-r0-hot-burst.requests.jsonl"
    assert logs.client == tmp_path / "single-r0-hot-burst.client.jsonl"
    records = [_record(0.0, 0.1), _record(1.0, None, status=503)]
    write_client_records(logs.client, records)
    back = [json.loads(x) for x in logs.client.read_text().splitlines()]
    assert [RequestRecord(**x) for x in back] == records


class _Reached(Exception):
    """The calibration reached its target: the options were taken."""


@pytest.mark.parametrize("where", ["--data-dir", "LORAPLEX_DATA_DIR"])
def test_calibrate_url_reads_the_data_dirs_admin_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """As ``preflight --url`` and ``qualify --url``: with no ``--admin-key`` the data directory's
    ``admin-key`` file (where ``serve`` keeps a generated one). On main ``--data-dir`` was an
    unknown option, and without ``--admin-key`` the command was refused."""
    from loraplex.bench.sim import calibrate_target

    (tmp_path / "admin-key").write_text("the-deployments-admin-key\n", encoding="utf-8")
    asked: list[tuple[object, ...]] = []

    def _remote(*args: object) -> NoReturn:
        asked.append(args)
        raise _Reached

    monkeypatch.setattr(calibrate_target, "remote_target", _remote)
    args = ["calibrate", "--out", "o.json", "--hardware", "h", "--url", "http://x"]
    env = {"LORAPLEX_ADMIN_KEY": "", "LORAPLEX_DATA_DIR": ""}
    if where == "--data-dir":
        args += ["--data-dir", str(tmp_path)]
    else:
        env["LORAPLEX_DATA_DIR"] = str(tmp_path)
    result = CliRunner().invoke(_sim_group(), args, env=env)
    assert isinstance(result.exception, _Reached), result.output
    assert asked == [("http://x", "the-deployments-admin-key", 8, False)]
    result = CliRunner().invoke(_sim_group(), [*args, "--admin-key", "given-admin-key"], env=env)
    assert isinstance(result.exception, _Reached), result.output
    assert asked[-1] == ("http://x", "given-admin-key", 8, False)  # the flag comes first


def test_a_fleet_run_keeps_its_client_records_in_the_logs_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--logs-dir`` with the fleet alone: each real fleet run writes the client's records as
    ``fleet-r<repeat>-<trace>.client.jsonl`` (the deployment, the replay and the fleet's
    counters stubbed)."""
    from contextlib import contextmanager

    from loraplex.bench.fleet import cluster, drive
    from loraplex.bench.sim import bench, validate

    records = [_record(0.0, 0.1), _record(0.5, 0.2)]

    @contextmanager
    def nothing(*_: Any, **__: Any) -> Any:
        yield 1234

    async def replay(*_: Any) -> list[RequestRecord]:
        return records

    monkeypatch.setattr(cluster, "local_cluster", nothing)
    monkeypatch.setattr(cluster, "deployed", nothing)
    monkeypatch.setattr(cluster, "settled_counters", lambda *_: None)
    monkeypatch.setattr(cluster, "board_entries", lambda: [])
    monkeypatch.setattr(cluster, "fleet_state", lambda *_: {"decisions": {"gpu_hit": 2}})
    monkeypatch.setattr(drive, "replay", replay)
    monkeypatch.setattr(validate, "fleet_settings", lambda *_: None)
    monkeypatch.setattr(validate, "drop_page_cache", lambda *_: None)
    logs = tmp_path / "logs"
    logs.mkdir()
    config = SimBenchConfig(
        traces=("hot-burst",), targets=("fleet",), scale=None, trace_requests=8, logs_dir=logs
    )
    registry: Any = SimpleNamespace(keys={}, store=None, admin_key="k")
    out = bench.real(config, config.workloads(), registry, tmp_path, 100)
    assert out["fleet"]["hot-burst"][0]["decisions"] == {"gpu_hit": 2}
    kept = logs / "fleet-r0-hot-burst.client.jsonl"
    assert sorted(p.name for p in logs.iterdir()) == [kept.name]
    assert [RequestRecord(**json.loads(x)) for x in kept.read_text().splitlines()] == records


def test_the_fleets_drawn_ids_give_the_hit_ratios_mean_and_range() -> None:
    """``bench sim --fleet-id-draws``: each draw names the replicas afresh (Ray-like ids, from the
    seed: the same draws every run); the mean per tier lies within the draws' range, and a
    count of 0 is the simulator's own names alone."""
    import random

    from loraplex.bench.sim.simulated import RAY_ID_LENGTH, id_drawn_hit_ratios, ray_like_ids
    from loraplex.sim.call import records
    from loraplex.sim.profiles import load_profile

    ids = ray_like_ids(random.Random(0), 3)
    assert len(set(ids)) == 3 and all(len(i) == RAY_ID_LENGTH and i.isalnum() for i in ids)
    workload = generate("zipf-longtail", 0, ScenarioParams(duration_s=8, rate=4, num_adapters=16))
    trace = records(workload_rows(workload, 64))
    values = {"replicas": 3, "max_loras": 2}
    model = load_profile("h100-sxm-llama2-7b-bf16")
    drawn = id_drawn_hit_ratios(trace, values, model, 6, seed=0)
    assert drawn == id_drawn_hit_ratios(trace, values, model, 6, seed=0)
    assert drawn["draws"] == 6
    for tier in ("L0", "L1", "L2", "L3"):
        assert drawn["min"][tier] <= drawn["mean"][tier] <= drawn["max"][tier]
    assert SimBenchConfig().fleet_id_draws == 0  # the fleet places by rank: no draws
    assert SimBenchConfig(fleet_id_draws=0).fleet_id_draws == 0
    with pytest.raises(ValueError, match="fleet_id_draws True is invalid"):
        SimBenchConfig(fleet_id_draws=True)


def test_bench_sim_hardware_is_a_free_form_label_of_the_measured_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``bench sim --hardware`` names the machine its in-run calibration measures (as ``sim
    calibrate --hardware``), not a profile of ``sim/profiles``: any non-blank name reaches the
    calibration, stripped; a blank one is refused naming the flag."""
    from typer.testing import CliRunner

    from loraplex.cli import app, bench_sim

    seen: list[str] = []

    def calibrated(asset_dir: Path, max_loras: int, hardware: str, logs_dir: object) -> None:
        seen.append(hardware)
        raise typer.Exit(3)  # stop before anything runs

    monkeypatch.setattr(bench_sim, "_calibrated", calibrated)
    result = CliRunner().invoke(app, ["bench", "sim", "--no-scale", "--hardware", " zz "])
    assert result.exit_code == 3 and seen == ["zz"], result.output
    blank = CliRunner().invoke(app, ["bench", "sim", "--no-scale", "--hardware", " "])
    assert blank.exit_code == 2 and "--hardware" in blank.output and seen == ["zz"]
