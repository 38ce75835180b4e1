"""The vLLM side's command line and environment, as vLLM 0.32's CPU build reads them: the
matched settings (KV bytes from the model's shapes, step token budget, max LoRA rank), LoRA on
or off, the thread binding, the fresh compile caches, and what the JSON line records."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import loraplex
from loraplex.bench.harness.process import free_port, module_command
from loraplex.bench.peer.assets import PeerAssets, peer_assets
from loraplex.bench.peer.loraplex_side import (
    REQUEST_LOG,
    LoraplexServer,
    kv_cache_bytes,
    matched_settings,
)
from loraplex.bench.peer.run import matched_record, vllm_bindings
from loraplex.bench.peer.vllm import (
    GIB,
    VLLM_SERVER_MODULE,
    PeerSettings,
    VllmServer,
    bound_cores,
    check_cpu_bind,
    vllm_command,
    vllm_env,
    vllm_module_name,
)
from loraplex.bench.serve.fleet import Fleet, _write_config, serve_values
from loraplex.demo.manifest import DemoAssets
from loraplex.serve.config.file import read_config_file


@pytest.fixture(scope="module")
def s2(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> PeerAssets:
    return peer_assets(demo_assets, "s2", tmp_path_factory.mktemp("unused"), seed=0)


def _value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_matched_settings_come_from_loraplex_defaults_and_the_model(s2: PeerAssets) -> None:
    settings = matched_settings(s2, 8, threads=1, vllm_cpu_bind="auto")
    # 1024 blocks x 16 tokens x 4 layers x (K + V) x 2 kv heads x head_dim 32 x 4 bytes
    assert settings.kv_cache_bytes == 1024 * 16 * 4 * 2 * 2 * 32 * 4 == 32 << 20
    assert kv_cache_bytes(s2, 10, 16) == 10 * 16 * 4 * 2 * 2 * 32 * 4
    assert (settings.max_model_len, settings.max_num_seqs, settings.threads) == (512, 32, 1)
    assert settings.max_num_batched_tokens == 512  # ServeConfig's default, given to both
    assert settings.max_lora_rank == 64  # the demo's widest adapter
    assert settings.kv_cache_gib() == 1 / 32


def test_vllm_command_carries_the_matched_settings(s2: PeerAssets) -> None:
    settings = matched_settings(s2, 8, threads=1, vllm_cpu_bind="auto")
    python = Path("/opt/vllm/bin/python")
    command = vllm_command(python, s2, settings, port=8123, api_key="k")
    assert command[:4] == module_command(str(python), VLLM_SERVER_MODULE)
    assert _value(command, "--model") == str(s2.base_model_dir)
    assert _value(command, "--served-model-name") == s2.base_model_name
    assert (_value(command, "--port"), _value(command, "--api-key")) == ("8123", "k")
    assert _value(command, "--dtype") == "float32"
    assert _value(command, "--max-loras") == "8" and _value(command, "--max-cpu-loras") == "16"
    assert _value(command, "--max-lora-rank") == "64" and _value(command, "--max-num-seqs") == "32"
    assert _value(command, "--max-model-len") == "512"
    assert _value(command, "--max-num-batched-tokens") == "512"
    assert _value(command, "--kv-cache-memory-bytes") == str(32 << 20)
    assert "--enable-lora" in command
    modules = command[command.index("--lora-modules") + 1 :]
    assert modules == [f"{vllm_module_name(a)}={a.path}" for a in s2.adapters]
    assert len(set(modules)) == 16


def test_without_lora_vllm_serves_the_base_model_with_the_same_settings(s2: PeerAssets) -> None:
    settings = matched_settings(s2, 8, threads=1, vllm_cpu_bind="auto")
    with_lora = vllm_command(Path("p"), s2, settings, port=1, api_key="k")
    base = vllm_command(Path("p"), s2, settings, port=1, api_key="k", lora=False)
    assert base == with_lora[: with_lora.index("--enable-lora")]
    assert not {"--enable-lora", "--max-loras", "--lora-modules"} & set(base)
    server = VllmServer(Path("p"), s2, settings, start_timeout_s=1.0, lora=False)
    assert server.label == "vllm-nolora" and not server.serves_adapters
    assert server.routes() == () and server.base_route().model == s2.base_model_name
    lora = VllmServer(Path("p"), s2, settings, start_timeout_s=1.0)
    assert lora.label == "vllm" and len(lora.routes()) == 16


def test_loraplex_gets_the_same_step_token_budget(s2: PeerAssets, tmp_path: Path) -> None:
    settings = matched_settings(s2, 8, threads=1, vllm_cpu_bind="auto")
    fleet = Fleet(tmp_path, s2.base_model_dir, {t: "k" for t in {a.tenant for a in s2.adapters}},
                  "admin", settings.max_lora_rank)  # fmt: skip
    server = LoraplexServer(fleet, s2, settings, queue_deadline_s=60.0, start_timeout_s=60.0)
    values = serve_values(fleet, tmp_path, server._options, port=1)
    assert values["max_num_batched_tokens"] == 512 and values["max_num_seqs"] == 32
    assert values["max_loras"] == 8 and values["max_lora_rank"] == 64
    # every adapter may take a slot, one tenant's too (r16: all 16 are the "bench" tenant's)
    assert values["default_tenant_tier_share"] == 1.0
    written = _write_config(fleet, tmp_path, server._options, port=1)
    assert read_config_file(written)["default_tenant_tier_share"] == 1.0  # a key serve reads


def test_loraplex_writes_a_request_log_per_run_only_when_asked(
    s2: PeerAssets, tmp_path: Path
) -> None:
    """``scripts/peer-trace`` asks for it; bench peer never does (its server stays as measured)."""
    settings = matched_settings(s2, 16, threads=1, vllm_cpu_bind="auto")
    fleet = Fleet(tmp_path, s2.base_model_dir, {t: "k" for t in {a.tenant for a in s2.adapters}},
                  "admin", settings.max_lora_rank)  # fmt: skip
    plain = LoraplexServer(fleet, s2, settings, queue_deadline_s=60.0, start_timeout_s=60.0)
    logged = LoraplexServer(fleet, s2, settings, queue_deadline_s=60.0, start_timeout_s=60.0,
                            request_log=True)  # fmt: skip
    run = tmp_path / "run-3"
    assert "request_log_path" not in serve_values(fleet, run, plain._run_options(run), port=1)
    values = serve_values(fleet, run, logged._run_options(run), port=1)
    assert values["request_log_path"] == str(run / REQUEST_LOG)
    assert values["max_loras"] == 16  # everything else as bench peer runs it
    assert logged._run_options(run) == replace(plain._options, request_log_path=run / REQUEST_LOG)


def test_vllm_env_binds_as_vllm_does_and_compiles_afresh(tmp_path: Path) -> None:
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    inherited = {"PATH": "/bin", "LD_PRELOAD": "/x.so", "VLLM_CPU_KVCACHE_SPACE": "40"}
    env = vllm_env(inherited, PeerSettings(max_loras=8), lib, tmp_path / "run-1")
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"  # vLLM's default binding
    assert env["OMP_NUM_THREADS"] == "1"
    # whole GiB only, and it would override --kv-cache-memory-bytes: never inherited
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "run-1" / "vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "run-1" / "inductor")
    assert env["LD_PRELOAD"] == f"{lib} /x.so" and env["PATH"] == "/bin"
    bound = vllm_env({}, PeerSettings(max_loras=8, vllm_cpu_bind="1"), None, tmp_path)
    assert bound["VLLM_CPU_OMP_THREADS_BIND"] == "1" and "LD_PRELOAD" not in bound
    nobind = vllm_env({}, PeerSettings(max_loras=8, vllm_cpu_bind="nobind"), None, tmp_path)
    assert nobind["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_cpu_bind_values() -> None:
    for good in ("auto", "nobind", "1", "0-3,6"):
        check_cpu_bind(good)
    for bad in ("Auto", "0|1", "", "1,", "a", "0-"):  # "|": a second worker, which never runs
        with pytest.raises(ValueError, match="vllm_cpu_bind"):
            check_cpu_bind(bad)
    with pytest.raises(ValueError, match="max_num_batched_tokens 0 is invalid"):
        PeerSettings(max_loras=8, max_num_batched_tokens=0)


def test_the_bound_cores_are_read_from_vllms_log(tmp_path: Path) -> None:
    line = ("INFO OpenMP thread binding info: \n\tVLLM_CPU_OMP_THREADS_BIND='auto', "
            "auto_setup=True\n\tlocal_rank=0, core ids=[0, 2, 3]\n\treserved_cpus=[1]")  # fmt: skip
    assert bound_cores(line) == [0, 2, 3]
    assert bound_cores("VLLM_CPU_OMP_THREADS_BIND='nobind', skip_setup=True") is None
    (tmp_path / "run-1-vllm").mkdir()
    (tmp_path / "run-1-vllm" / "vllm.log").write_text(line)
    (tmp_path / "run-2-vllm-nolora").mkdir()
    (tmp_path / "run-2-vllm-nolora" / "vllm.log").write_text("no binding")
    assert vllm_bindings(tmp_path) == {"run-1-vllm": [0, 2, 3], "run-2-vllm-nolora": None}


def test_the_record_keeps_the_kv_bytes_and_what_vllm_cpu_kvcache_space_cannot_say(
    s2: PeerAssets,
) -> None:
    from loraplex.bench.peer.model import SettingRuns

    settings = matched_settings(s2, 16, threads=1, vllm_cpu_bind="auto")
    (record,) = matched_record([SettingRuns(settings, ("loraplex", "vllm"), (), None, ())])
    assert record["kv_cache_bytes"] == 32 << 20 and record["kv_cache_gib"] == 0.03125
    assert record["vllm_cpu_kvcache_space"] is None  # left unset: whole GiB only
    assert record["max_num_batched_tokens"] == 512 and record["vllm_cpu_bind"] == "auto"
    assert GIB == 1 << 30


# vLLM's server module as a stand-in (vLLM is not installed here): it answers 200 on --port and
# says its pid
_STAND_IN = """
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
print("server", os.getpid(), flush=True)
http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""
# A benchmark that starts it as the peer run does, says so, and waits to be killed
_BENCHMARK = """
import json, sys, time
from pathlib import Path
from loraplex.bench.peer.vllm import vllm_serving
command, env, port, log = json.loads(sys.argv[1])
with vllm_serving(command, env, port, Path(log), 60.0):
    print("ready", flush=True)
    time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for init counts: it runs no more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_benchmark_takes_its_vllm_server_with_it(s2: PeerAssets, tmp_path: Path) -> None:
    """``bench peer`` killed (a timeout's SIGKILL) left ``python -m vllm...`` running, an
    orphan holding its memory and cores: ``stop_group`` never ran. Now the server's command
    asks Linux to SIGTERM it when its parent dies, as ``serve_command``'s child does."""
    package = tmp_path / "stand_in" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(_STAND_IN)
    port = free_port()
    settings = matched_settings(s2, 8, threads=1, vllm_cpu_bind="auto")
    command = vllm_command(Path(sys.executable), s2, settings, port=port, api_key="k")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stand_in")}
    log = tmp_path / "vllm.log"
    root = str(Path(loraplex.__file__).parents[1])
    benchmark = subprocess.Popen(
        [sys.executable, "-c", _BENCHMARK, json.dumps([command, env, port, str(log)])],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    )
    server = 0
    try:
        assert benchmark.stdout is not None
        ready, _, _ = select.select([benchmark.stdout], [], [], 60.0)
        assert ready and benchmark.stdout.readline() == b"ready\n", log.read_text()
        server = int(log.read_text().split("server ")[1].split()[0])
        assert not _gone(server)
        benchmark.kill()
        benchmark.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not _gone(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(server), "the vLLM stand-in outlived the killed benchmark"
    finally:
        benchmark.kill()
        benchmark.wait(timeout=10)
        if server and not _gone(server):
            os.kill(server, signal.SIGKILL)
