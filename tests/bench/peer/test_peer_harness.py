"""``loraplex bench peer``'s whole harness without vLLM: the memory sampler, and every server run
against stand-ins for vLLM's two kinds (a second ``loraplex serve`` that names the adapters as
vLLM's ``--lora-modules`` would, with one key for all; and the same without adapters). vLLM
itself never runs.
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

from loraplex.bench.peer.assets import PeerAssets, peer_assets
from loraplex.bench.peer.bench import PeerServer, run_peer_bench
from loraplex.bench.peer.client import Route
from loraplex.bench.peer.loraplex_side import LoraplexServer, prepare_fleet
from loraplex.bench.peer.memory import RssSampler, descendants, parent_map, rss_bytes
from loraplex.bench.peer.model import PeerBenchConfig, SettingRuns
from loraplex.bench.peer.report import SIDES, cpu_description, peer_result
from loraplex.bench.peer.vllm import PeerSettings, vllm_module_name
from loraplex.bench.serve.fleet import Fleet, ServerOptions, serving
from loraplex.demo.manifest import DemoAssets

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
    """A stand-in for vLLM: ``loraplex serve`` with every peer adapter registered under one
    tenant by its vLLM module name (one flat namespace, one key), like ``--lora-modules``;
    ``serves_adapters`` False: the base model only, like vLLM without ``--enable-lora``."""

    def __init__(
        self, fleet: Fleet, assets: PeerAssets, settings: PeerSettings, serves_adapters: bool
    ) -> None:
        self._fleet, self._assets = fleet, assets
        self._options = ServerOptions("lru", settings.max_loras, 256 << 20, torch_threads=1)
        self.serves_adapters = serves_adapters
        self.label = "stand-in" if serves_adapters else "stand-in-nolora"

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        return serving(self._fleet, data_dir, self._options)

    def routes(self) -> tuple[Route, ...]:
        if not self.serves_adapters:
            return ()
        key = self._fleet.keys[STANDIN_TENANT]
        return tuple(Route(vllm_module_name(a), key) for a in self._assets.adapters)

    def base_route(self) -> Route:
        return Route(self._assets.base_model_name, self._fleet.keys[STANDIN_TENANT])


def _standin_fleet(root: Path, assets: PeerAssets) -> Fleet:
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
    """Wraps a kind to record how many servers are alive while each one serves."""

    def __init__(self, inner: PeerServer, alive: list[str], most: list[int]) -> None:
        self.label, self.serves_adapters = inner.label, inner.serves_adapters
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


KINDS = ["loraplex", "stand-in", "stand-in-nolora"]
ORDER = KINDS + KINDS[::-1]  # ABBA over the three kinds, two rounds


@pytest.fixture(scope="module")
def harness(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], list[SettingRuns], list[int], PeerAssets]:
    config = PeerBenchConfig(max_loras=(4,), requests=4, prompt_tokens=8, output_tokens=4,
                             trace_requests=4, load=0.5, greedy_prompts=3, greedy_tokens=4,
                             rounds=2, request_timeout_s=60.0, start_timeout_s=180.0)  # fmt: skip
    assets = peer_assets(demo_assets, "s2", Path("unused"), seed=0)
    alive: list[str] = []
    most: list[int] = []

    def make_servers(settings: PeerSettings, root: Path) -> tuple[PeerServer, ...]:
        ours = prepare_fleet(root / "ours", assets, settings.max_lora_rank)
        theirs = _standin_fleet(root / "theirs", assets)
        loraplex = LoraplexServer(
            ours, assets, settings, queue_deadline_s=60.0, start_timeout_s=180.0
        )
        kinds = (loraplex, StandIn(theirs, assets, settings, True),
                 StandIn(theirs, assets, settings, False))  # fmt: skip
        return tuple(OneAtATime(kind, alive, most) for kind in kinds)

    root = tmp_path_factory.mktemp("peer-runs")
    runs = run_peer_bench(config, assets, make_servers, root)
    # every run's server log is kept under the run directory (issue 26: they were deleted)
    logs = sorted(p.relative_to(root).as_posix() for p in root.rglob("server.log"))
    assert logs == sorted(f"max-loras-4/run-{i}-{kind}/server.log" for i, kind in
                          enumerate(ORDER))  # fmt: skip
    return peer_result(config, runs, "stand-in"), runs, most, assets


@pytest.mark.slow  # six real server runs
def test_harness_runs_abba_and_both_sides_agree(
    harness: tuple[dict[str, Any], list[SettingRuns], list[int], PeerAssets],
) -> None:
    result, runs, most, assets = harness
    assert result["name"] == "peer" and result["config"]["peer"] == "stand-in"
    lifetimes = runs[0].lifetimes
    assert [lt.label for lt in lifetimes] == ORDER
    assert most == [1] * 6  # never two servers at once
    # the trace once both capacities are known (from the 3rd run), on the adapter kinds only
    assert [lt.trace is not None for lt in lifetimes] == [False, False, False, False, True, True]
    # the same trace on both sides, each under its own names for the adapters
    as_module = {f"{a.name}@{a.revision}": vllm_module_name(a) for a in assets.adapters}
    theirs, ours = (lt.trace.records for lt in lifetimes[4:] if lt.trace is not None)
    assert len(ours) > 0 and [as_module[r.adapter] for r in ours] == [r.adapter for r in theirs]
    # the kind without adapters ran the base batch only
    nolora = [lt for lt in lifetimes if lt.label == "stand-in-nolora"]
    assert all(lt.adapter is None and lt.probes == () and lt.base.completed == 4 for lt in nolora)
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
    base_only = setting["vllm_nolora"]
    assert base_only["base_completed_ratio"] == 1.0 and base_only["adapter_tokens_per_s"] is None
    assert base_only["first_answer_completed_ratio"] == 1.0 and base_only["lifetimes"] == 2
    # the same engine behind both names: every greedy continuation is identical
    assert setting["greedy_prompts"] == 3 and setting["greedy_matched"] == 3
    assert setting["common_rate_rps"] > 0 and setting["rounds"] == 2
    for name in ("adapter_throughput_over_vllm", "base_throughput_over_vllm",
                 "base_throughput_over_vllm_nolora", "adapter_traffic_over_best_base",
                 "common_rate_p99_ttft_over_vllm", "start_to_first_answer_over_vllm",
                 "peak_rss_over_vllm"):  # fmt: skip
        assert isinstance(metrics[name], float) and metrics[name] > 0, name
        assert metrics[name] == setting[name]
        low, high = metrics[f"{name}_min"], metrics[f"{name}_max"]
        assert isinstance(low, float) and isinstance(high, float) and 0 < low <= high, name
    assert metrics["probes_passed_loraplex"] == 16 and metrics["probes_passed_vllm"] == 16


def test_the_cpu_and_its_vector_extensions_are_recorded(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
        "model name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
        "model name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n"
    )
    assert cpu_description(info) == {
        "model": "AMD EPYC", "isa": ["avx2"], "vendor": "AuthenticAMD", "family": 26, "model_id": 2,
    }  # fmt: skip
    info.write_text("model name : X\nflags : avx2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_description(info)["isa"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]
    assert cpu_description(tmp_path / "missing") == {
        "model": "unknown", "isa": [], "vendor": None, "family": None, "model_id": None,
    }  # fmt: skip


@pytest.mark.slow  # one real server run
def test_the_r16_mix_is_registered_and_served(demo_assets: DemoAssets, tmp_path: Path) -> None:
    """The r16 adapters (no probes) reach a real ``loraplex serve`` as the peer side runs it:
    registered under their tenant with max rank 16, and each one answers through its route."""
    import asyncio

    from loraplex.bench.peer.client import answers
    from loraplex.bench.peer.loraplex_side import matched_settings
    from loraplex.registry import RegistryConfig, open_registry

    assets = peer_assets(demo_assets, "r16", tmp_path / "r16", seed=0)
    settings = matched_settings(assets, 4, threads=1, vllm_cpu_bind="auto")
    fleet = prepare_fleet(tmp_path / "fleet", assets, settings.max_lora_rank)
    config = RegistryConfig(tmp_path / "fleet", fleet.database_url, str(fleet.store), None, 16)
    registry = open_registry(config)
    try:
        revisions = [registry.get_revision(f"{a.tenant}/{a.name}@{a.revision}")
                     for a in assets.adapters]  # fmt: skip
    finally:
        registry.close()
    assert {r.max_rank for r in revisions} == {16} and len(
        {r.adapter_digest for r in revisions}
    ) == 16
    assert set(fleet.keys) == {"bench"}
    server = LoraplexServer(fleet, assets, settings, queue_deadline_s=60.0, start_timeout_s=180.0)
    probes = tuple((i, a.probe_prompt, 4) for i, a in enumerate(assets.adapters))
    with server.serving(tmp_path / "run") as url:
        routes = (*server.routes(), server.base_route())
        texts = asyncio.run(answers(url, routes, probes, 60.0))
    assert all(isinstance(text, str) for text in texts)  # every adapter answered
