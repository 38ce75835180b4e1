"""``loraplex bench peer`` without vLLM: the refusals, the vLLM command line and environment, the
figures (null ratios, failures at the timeout, least favourable setting), the memory sampler,
and the whole harness once against a stand-in for vLLM (a second ``loraplex serve`` that names
the adapters as vLLM's ``--lora-modules`` would, with one key for all). vLLM itself never runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.bench.peer import bench as peer_module
from loraplex.bench.peer.bench import PeerServer, run_peer_bench
from loraplex.bench.peer.client import BatchResult, Route
from loraplex.bench.peer.loraplex_side import LoraplexServer, matched_settings, prepare_demo_fleet
from loraplex.bench.peer.memory import RssSampler, descendants, parent_map, rss_bytes
from loraplex.bench.peer.model import Lifetime, PeerBenchConfig, SettingRuns
from loraplex.bench.peer.report import (
    SIDES,
    cpu_description,
    headline_metrics,
    peer_result,
    ratio,
    side_stats,
    ttft_ms,
)
from loraplex.bench.peer.vllm import (
    PeerSettings,
    VllmUnavailableError,
    check_cpu_bind,
    check_vllm_python,
    vllm_command,
    vllm_env,
    vllm_module_name,
)
from loraplex.bench.serve.driver import RequestRecord
from loraplex.bench.serve.fleet import Fleet, ServerOptions, serving
from loraplex.cli import app
from loraplex.demo.manifest import DemoAssets

# --- the command's refusals -------------------------------------------------------------------


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if the command gets as far as checking vLLM or running anything."""

    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(peer_module, "run_against_vllm", refuse)
    monkeypatch.setattr("loraplex.bench.peer.vllm.check_vllm_python", refuse)


def test_without_vllm_python_the_command_exits_2_and_runs_nothing(nothing_runs: None) -> None:
    result = CliRunner().invoke(app, ["bench", "peer", "--json"])
    assert result.exit_code == 2
    assert "--vllm-python" in result.output and "nothing was run" in result.output
    assert "{" not in result.stdout  # no JSON line


def test_bad_settings_are_refused_before_vllm_is_checked(nothing_runs: None) -> None:
    for args in (["--max-loras", "0"], ["--rounds", "1"], ["--vllm-cpu-bind", "0|1"]):
        result = CliRunner().invoke(app, ["bench", "peer", "--vllm-python", sys.executable, *args])
        assert result.exit_code == 2, args
        assert "is invalid" in result.output, args


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_vllm_python_must_exist_and_import_vllm(tmp_path: Path) -> None:
    with pytest.raises(VllmUnavailableError, match="expected an executable file"):
        check_vllm_python(tmp_path / "missing-python")
    no_vllm = _script(tmp_path / "no-vllm", "echo \"No module named 'vllm'\" >&2; exit 1")
    refusal = r"cannot import vllm \(exit 1\): No module named"
    with pytest.raises(VllmUnavailableError, match=refusal):
        check_vllm_python(no_vllm)
    hangs = _script(tmp_path / "hangs", "sleep 30")
    with pytest.raises(VllmUnavailableError, match="did not finish"):
        check_vllm_python(hangs, timeout_s=0.5)
    works = _script(tmp_path / "works", "echo 0.32.0")
    assert check_vllm_python(works) == "0.32.0"


def test_the_command_reports_a_python_without_vllm(tmp_path: Path) -> None:
    no_vllm = _script(tmp_path / "no-vllm", "echo 'No module named vllm' >&2; exit 1")
    result = CliRunner().invoke(app, ["bench", "peer", "--vllm-python", str(no_vllm)])
    assert result.exit_code == 2
    assert "cannot import vllm" in result.output and "nothing was run" in result.output


# --- the vLLM side's command line ---------------------------------------------------------------


def test_vllm_command_carries_the_matched_settings(demo_assets: DemoAssets) -> None:
    settings = matched_settings(demo_assets, 8, threads=1, vllm_cpu_bind="nobind")
    # loraplex's defaults: 1024 blocks x 16 tokens x (K + V) x 4 layers x 2 heads x 32 x 4 bytes
    assert settings.kv_cache_bytes == 1024 * 16 * 2 * 4 * 2 * 32 * 4
    assert (settings.max_model_len, settings.max_num_seqs, settings.threads) == (512, 32, 1)
    python = Path("/opt/vllm/bin/python")
    command = vllm_command(python, demo_assets, settings, port=8123, api_key="k")
    assert command[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert value("--model") == str(demo_assets.base_model_dir)
    assert value("--served-model-name") == demo_assets.base_model_name
    assert (value("--host"), value("--port"), value("--api-key")) == ("127.0.0.1", "8123", "k")
    assert value("--dtype") == "float32"
    assert value("--max-loras") == "8" and value("--max-cpu-loras") == "16"
    assert value("--max-lora-rank") == "64" and value("--max-num-seqs") == "32"
    assert value("--max-model-len") == "512"
    assert value("--kv-cache-memory-bytes") == str(settings.kv_cache_bytes)
    assert "--enable-lora" in command
    modules = command[command.index("--lora-modules") + 1 :]
    expected = [f"{vllm_module_name(a)}={a.path}" for a in demo_assets.adapters]
    assert modules == expected and len(set(modules)) == 16


def test_vllm_env_is_offline_with_one_thread_and_tcmalloc(tmp_path: Path) -> None:
    settings = PeerSettings(max_loras=8)
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    env = vllm_env({"PATH": "/bin", "LD_PRELOAD": "/x.so"}, settings, lib)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["OMP_NUM_THREADS"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["LD_PRELOAD"] == f"{lib} /x.so" and env["PATH"] == "/bin"
    bound = vllm_env({}, PeerSettings(max_loras=8, vllm_cpu_bind="1"), None)
    assert bound["VLLM_CPU_OMP_THREADS_BIND"] == "1" and "LD_PRELOAD" not in bound


def test_cpu_bind_values() -> None:
    for good in ("nobind", "1", "0-3,6"):
        check_cpu_bind(good)
    for bad in ("auto", "0|1", "", "1,", "a"):
        with pytest.raises(ValueError, match="vllm_cpu_bind"):
            check_cpu_bind(bad)


# --- figures --------------------------------------------------------------------------------


def _record(ok: bool, ttft_s: float | None, tokens: int = 4) -> RequestRecord:
    status, error = (200, None) if ok else (0, "timeout")
    return RequestRecord(
        0.0, "t", "m", "L0", status, ttft_s, None, tokens if ok else 0, None, error
    )


def _batch(records: list[RequestRecord], wall_s: float = 2.0) -> BatchResult:
    return BatchResult(tuple(records), wall_s)


def test_ratio_is_null_when_undefined_never_zero() -> None:
    assert ratio(2.0, 4.0) == 0.5
    assert ratio(None, 4.0) is None and ratio(2.0, None) is None
    assert ratio(2.0, 0.0) is None and ratio(0.0, 0.0) is None
    assert ratio(0.0, 3.0) == 0.0  # a real zero on top stays a zero


def test_failures_count_at_the_timeout_in_the_percentiles() -> None:
    done = [_record(True, 0.010) for _ in range(97)]
    failed = [_record(False, None), _record(False, None), _record(False, 0.5)]
    batch = _batch(done + failed)
    assert ttft_ms([batch], timeout_s=60.0, q=0.99) == 60_000.0
    assert ttft_ms([batch], timeout_s=60.0, q=0.5) == 10.0
    assert ttft_ms([_batch(done)], timeout_s=60.0, q=0.99) == 10.0
    assert ttft_ms([], timeout_s=60.0, q=0.99) is None
    assert batch.completed == 97 and batch.tokens_per_s == 97 * 4 / 2.0


def _lifetime(label: str, first_s: float | None, tokens_per_s: float, ok: bool = True) -> Lifetime:
    adapter = _batch([_record(ok, 0.01, tokens=int(tokens_per_s))], wall_s=1.0)
    return Lifetime(label, first_s, ("a", "x"), ("g",), adapter, adapter, None, 100 << 20)


def test_side_stats_count_a_failed_start_at_the_start_timeout() -> None:
    lifetimes = [_lifetime("vllm", 30.0, 10), _lifetime("vllm", None, 20)]
    stats = side_stats(lifetimes, ("a", "b"), timeout_s=60.0, start_timeout_s=600.0)
    assert stats["start_to_first_answer_s"] == 315.0  # median of 30 and 600 (the timeout)
    assert stats["first_answer_completed_ratio"] == 0.5
    assert stats["adapter_tokens_per_s"] == 15.0 and stats["adapter_completed_ratio"] == 1.0
    assert stats["probes_passed"] == 1  # "a" matches, "x" is not "b"
    assert stats["trace_p99_ttft_ms"] is None and stats["trace_completed_ratio"] is None
    assert stats["peak_rss_mib"] == 100.0 and stats["capacity_rps"] == 1.0


def _setting(max_loras: int, adapter: float | None, ttft: float | None) -> dict[str, Any]:
    side = {"adapter_tokens_per_s": 1.0, "adapter_completed_ratio": 1.0, "base_tokens_per_s": 1.0,
            "base_completed_ratio": 1.0, "trace_p99_ttft_ms": 1.0, "trace_completed_ratio": 0.9,
            "start_to_first_answer_s": 1.0, "first_answer_completed_ratio": 1.0,
            "peak_rss_mib": 1.0, "probes_passed": 16}  # fmt: skip
    return {"max_loras": max_loras, "adapter_throughput_over_vllm": adapter,
            "base_throughput_over_vllm": 1.0, "common_rate_p99_ttft_over_vllm": ttft,
            "start_to_first_answer_over_vllm": 0.1, "peak_rss_over_vllm": 0.5, "probes": 16,
            "greedy_prompts": 8, "greedy_matched": 8 if max_loras == 8 else 7,
            "loraplex": dict(side), "vllm": dict(side)}  # fmt: skip


def test_headline_is_the_least_favourable_setting_and_null_stays_null() -> None:
    metrics = headline_metrics([_setting(8, 6.0, 0.1), _setting(16, 5.5, 0.3)])
    assert metrics["adapter_throughput_over_vllm"] == 5.5  # higher is better: the smaller
    assert metrics["adapter_throughput"]["max_loras"] == 16
    assert metrics["common_rate_p99_ttft_over_vllm"] == 0.3  # lower is better: the larger
    detail = metrics["common_rate_p99_ttft"]
    assert detail["max_loras"] == 16 and detail["completed_ratio_vllm"] == 0.9
    assert {"loraplex", "vllm"} <= set(detail)
    assert metrics["greedy_matched"] == 7 and set(metrics["per_max_loras"]) == {"8", "16"}
    undefined = headline_metrics([_setting(8, None, 0.1), _setting(16, 5.5, 0.3)])
    assert undefined["adapter_throughput_over_vllm"] is None


# --- memory ---------------------------------------------------------------------------------


def _fake_proc(root: Path, tree: dict[int, tuple[int, int]]) -> Path:
    """A /proc with ``pid -> (parent, rss kB)``; comm names with spaces and parentheses."""
    for pid, (parent, rss_kb) in tree.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} (odd (name) x) S {parent} 1 1 0\n")
        (root / str(pid) / "status").write_text(f"Name:\tx\nVmRSS:\t  {rss_kb} kB\n")
    (root / "self").mkdir()
    return root


def test_process_tree_and_its_rss(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {10: (1, 5), 11: (10, 100), 12: (11, 200), 13: (1, 999)})
    parents = parent_map(proc)
    assert parents == {10: 1, 11: 10, 12: 11, 13: 1}
    assert descendants(10, parents) == [11, 12]
    assert rss_bytes(12, proc) == 200 * 1024 and rss_bytes(99, proc) == 0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_rss_sampler_sees_a_child_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); "
                              "time.sleep(30)"])  # fmt: skip
    try:
        with RssSampler(period_s=0.05) as rss:
            deadline = time.monotonic() + 20
            while (rss.peak_bytes or 0) < 64 << 20 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert rss.peak_bytes is not None and rss.peak_bytes >= 64 << 20
    finally:
        child.kill()
        child.wait()


# --- the whole harness, vLLM replaced by a stand-in ---------------------------------------------

STANDIN_TENANT = "peer"


class StandIn:
    """A stand-in for vLLM: ``loraplex serve`` with every demo adapter registered under one
    tenant by its vLLM module name (one flat namespace, one key), like ``--lora-modules``."""

    label = "stand-in"

    def __init__(self, fleet: Fleet, assets: DemoAssets, settings: PeerSettings) -> None:
        self._fleet, self._assets = fleet, assets
        self._options = ServerOptions("lru", settings.max_loras, 256 << 20, torch_threads=1)

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        return serving(self._fleet, data_dir, self._options)

    def routes(self) -> tuple[Route, ...]:
        key = self._fleet.keys[STANDIN_TENANT]
        return tuple(Route(vllm_module_name(a), key) for a in self._assets.adapters)

    def base_route(self) -> Route:
        return Route(self._assets.base_model_name, self._fleet.keys[STANDIN_TENANT])


def _standin_fleet(root: Path, assets: DemoAssets) -> Fleet:
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.registry import RegistrationRequest, RegistryConfig, open_registry

    fleet = Fleet(root, assets.base_model_dir, {}, "lpxadmin_" + "s" * 32, 64)
    config = RegistryConfig(root, fleet.database_url, str(fleet.store), None, 64)
    registry = open_registry(config, base=BaseModelSpec.from_dir(assets.base_model_dir))
    try:
        registry.create_tenant(STANDIN_TENANT, "test")
        fleet.keys[STANDIN_TENANT] = registry.create_key(STANDIN_TENANT, "test").token
        for adapter in assets.adapters:
            name = vllm_module_name(adapter)
            registry.register(RegistrationRequest(adapter.path, STANDIN_TENANT, name, "r1"), "test")
    finally:
        registry.close()
    return fleet


class OneAtATime:
    """Wraps a side to record how many servers are alive while each one serves."""

    def __init__(self, inner: PeerServer, alive: list[str], most: list[int]) -> None:
        self.label = inner.label
        self._inner, self._alive, self._most = inner, alive, most
        self.routes, self.base_route = inner.routes, inner.base_route

    @contextmanager
    def serving(self, data_dir: Path) -> Iterator[str]:
        with self._inner.serving(data_dir) as url:
            self._alive.append(self.label)
            self._most.append(len(self._alive))
            try:
                yield url
            finally:
                self._alive.remove(self.label)


@pytest.fixture(scope="module")
def harness(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], list[SettingRuns], list[int]]:
    config = PeerBenchConfig(max_loras=(4,), requests=4, prompt_tokens=8, output_tokens=4,
                             trace_requests=4, load=0.5, greedy_prompts=3, greedy_tokens=4,
                             rounds=2, request_timeout_s=60.0, start_timeout_s=180.0)  # fmt: skip
    alive: list[str] = []
    most: list[int] = []

    def make_pair(settings: PeerSettings, root: Path) -> tuple[PeerServer, PeerServer]:
        ours = prepare_demo_fleet(root / "ours", demo_assets, settings.max_lora_rank)
        theirs = _standin_fleet(root / "theirs", demo_assets)
        loraplex = LoraplexServer(
            ours, demo_assets, settings, queue_deadline_s=60.0, start_timeout_s=180.0
        )
        standin = StandIn(theirs, demo_assets, settings)
        return OneAtATime(loraplex, alive, most), OneAtATime(standin, alive, most)

    root = tmp_path_factory.mktemp("peer-runs")
    runs = run_peer_bench(config, demo_assets, make_pair, root)
    # every run's server log is kept under the run directory (issue 26: they were deleted)
    logs = sorted(p.relative_to(root).as_posix() for p in root.rglob("server.log"))
    assert logs == [f"max-loras-4/run-{i}-{side}/server.log" for i, side in
                    enumerate(["loraplex", "stand-in", "stand-in", "loraplex"])]  # fmt: skip
    return peer_result(config, runs, "stand-in"), runs, most


@pytest.mark.slow  # four real server runs
def test_harness_runs_abba_and_both_sides_agree(
    harness: tuple[dict[str, Any], list[SettingRuns], list[int]], demo_assets: DemoAssets
) -> None:
    result, runs, most = harness
    assert result["name"] == "peer" and result["config"]["peer"] == "stand-in"
    lifetimes = runs[0].lifetimes
    assert [lt.label for lt in lifetimes] == ["loraplex", "stand-in", "stand-in", "loraplex"]
    assert most == [1, 1, 1, 1]  # never two servers at once
    # the trace only once both capacities are known (the 3rd and 4th runs), the same trace
    assert [lt.trace is not None for lt in lifetimes] == [False, False, True, True]
    # the same trace on both sides, each under its own names for the adapters
    as_module = {f"{a.name}@{a.revision}": vllm_module_name(a) for a in demo_assets.adapters}
    theirs, ours = (lt.trace.records for lt in lifetimes[2:] if lt.trace is not None)
    assert len(ours) > 0 and [as_module[r.adapter] for r in ours] == [r.adapter for r in theirs]
    metrics = result["metrics"]
    setting = metrics["per_max_loras"]["4"]
    for role in SIDES:
        side = setting[role]
        assert side["probes_passed"] == 16, role  # every adapter answered its own probe
        assert side["adapter_completed_ratio"] == 1.0 and side["base_completed_ratio"] == 1.0
        assert side["trace_completed_ratio"] == 1.0 and side["lifetimes"] == 2
        assert side["adapter_tokens_per_s"] > 0 and side["trace_p99_ttft_ms"] > 0
        assert side["start_to_first_answer_s"] > 0 and side["first_answer_completed_ratio"] == 1
        assert side["peak_rss_mib"] > 0
    # the same engine behind both names: every greedy continuation is identical
    assert setting["greedy_prompts"] == 3 and setting["greedy_matched"] == 3
    assert setting["common_rate_rps"] > 0
    for name in ("adapter_throughput_over_vllm", "base_throughput_over_vllm",
                 "common_rate_p99_ttft_over_vllm", "start_to_first_answer_over_vllm",
                 "peak_rss_over_vllm"):  # fmt: skip
        assert isinstance(metrics[name], float) and metrics[name] > 0, name
        assert metrics[name] == setting[name]
    assert metrics["probes_passed_loraplex"] == 16 and metrics["probes_passed_vllm"] == 16


def test_the_cpu_and_its_vector_extensions_are_recorded(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n"
    )
    assert cpu_description(info) == {"model": "AMD EPYC", "isa": ["avx2"]}
    info.write_text("model name : X\nflags : avx2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_description(info)["isa"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]
    assert cpu_description(tmp_path / "missing") == {"model": "unknown", "isa": []}
