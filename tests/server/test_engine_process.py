"""The engine in its own process (the default of ``loraplex serve``): admin calls and tenant
settings reach the child's cache, errors cross the pipe with their types and attributes, a
dead engine process turns into 503s while the HTTP server stays up, and the child never
outlives its parent."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from live import Live, client, live_server

from loraplex.demo.assets import DemoAssets
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.transport.packed_errors import pack_error, unpack_error
from loraplex.engine.transport.process import EngineProcess
from loraplex.errors import (
    CacheIntegrityError,
    CapacityError,
    DigestMismatchError,
    EngineUnavailableError,
    QueueFullError,
    QueueTimeoutError,
)
from loraplex.sampling import SamplingParams
from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def _engine(live: Live) -> EngineProcess:
    engine = live.server.engine
    assert isinstance(engine, EngineProcess)
    return engine


@pytest.mark.parametrize(
    "error",
    [
        QueueTimeoutError("r-1", 2.5, 1.0),
        QueueFullError("tenant 'acme' queue", 8, 2.0),
        CacheIntegrityError("slots", "slot 3 held twice"),
        DigestMismatchError("acme/support@r1", "a" * 64, "b" * 64),
        CapacityError("no room"),
    ],
)
def test_errors_cross_the_pipe_with_type_message_and_attributes(error: Exception) -> None:
    rebuilt = unpack_error(pack_error(error))
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)
    assert vars(rebuilt) == vars(error)


def test_an_unknown_error_class_becomes_a_runtime_error_with_its_message() -> None:
    rebuilt = unpack_error(("loraplex.nowhere", "Gone", ("it broke",), {}))
    assert isinstance(rebuilt, RuntimeError)
    assert "it broke" in str(rebuilt)


def test_admin_residency_and_tenant_settings_reach_the_engine_process(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    adapter = demo_assets.adapters[0]
    ref = f"{adapter.tenant}/{adapter.name}@{adapter.revision}"
    with live_server(demo_assets, tmp_path, admin_key=ADMIN, max_loras=4) as live:
        assert _engine(live).pid != os.getpid()
        http = httpx.Client(base_url=live.url, headers=AUTH, timeout=60)
        # a cap below one slot, which the admin API refuses: stored as `tenants update` does,
        # then applied by a change of nothing
        live.server.registry.set_tenant_limits(adapter.tenant, "cli", None, {"max_gpu_bytes": 1})
        reply = http.put(f"/admin/tenants/{adapter.tenant}", json={"quotas": {}})
        assert reply.status_code == 200, reply.text
        refused = http.post("/admin/residency/pin", json={"model": ref, "tier": "L0", "wait": True})
        assert refused.status_code == 422, refused.text  # the child's cache applies the cap
        assert "tenant cap max_gpu_bytes 1 of tenant" in refused.json()["error"]["message"]

        roomy = {"quotas": {"max_gpu_bytes": 1 << 30}}
        assert http.put(f"/admin/tenants/{adapter.tenant}", json=roomy).status_code == 200
        pinned = http.post("/admin/residency/pin", json={"model": ref, "tier": "L0", "wait": True})
        assert pinned.json()["status"] == "resident", pinned.text
        entries = http.get("/admin/residency").json()["entries"]
        assert any(e["model"] == ref and e["tier"] == "L0" and e["pinned"] for e in entries)
        body = {"model": ref, "tier": "L0"}
        assert http.post("/admin/residency/evict", json=body).json()["evicted"] is False
        assert http.post("/admin/residency/unpin", json=body).status_code == 200
        assert http.post("/admin/residency/evict", json=body).json()["evicted"] is True
        entries = http.get("/admin/residency").json()["entries"]
        assert not any(e["model"] == ref and e["tier"] == "L0" for e in entries)
        asyncio.run(_a_duplicate_id_is_refused_and_leaves_the_first(live))


async def _a_duplicate_id_is_refused_and_leaves_the_first(live: Live) -> None:
    engine = _engine(live)
    ids = tuple(engine.tokenizer.encode("The acme support team"))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    request = EngineRequest("same-id", "acme", None, ids, params)
    first = engine.generate(request)
    head = await anext(first)
    with pytest.raises(ValueError, match="expected unique"):
        await anext(engine.generate(request))
    deltas = [head] + [d async for d in first]
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].completion_tokens == 6


def test_a_dead_engine_process_means_503_while_the_server_stays_up(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    adapter = demo_assets.adapters[0]
    with live_server(demo_assets, tmp_path, admin_key=ADMIN) as live:
        api = client(live.url, live.key(adapter.tenant))
        stream = api.completions.create(
            model=adapter.name, prompt=adapter.probe_prompt, max_tokens=400, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        first = next(iter(stream))
        assert first.choices[0].text is not None
        pid = _engine(live).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(openai.APIError):
            for _ in stream:
                pass
        http = httpx.Client(base_url=live.url, timeout=30)
        assert http.get("/health").json()["engine"] == "down"  # until it is restarted
        ready = http.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["reason"] == "EngineUnavailableError"
        with pytest.raises(openai.APIStatusError) as refused:
            api.completions.create(model=adapter.name, prompt="hello", max_tokens=2)
        assert refused.value.status_code == 503
        assert "engine process" in refused.value.message


def test_a_failing_engine_start_raises_and_leaves_no_process(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    before = set(_children())
    config = ServeConfig(data_dir=tmp_path, model=demo_assets.base_model_dir, demo=False,
                         admin_key=ADMIN, device="cuda:99")  # fmt: skip
    with pytest.raises(Exception) as failed:
        build_server(config)
    assert not isinstance(failed.value, EngineUnavailableError)  # the child's own error
    assert set(_children()) <= before


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


_ORPHAN_SCRIPT = """
import os, sys
from pathlib import Path
from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig
server = build_server(ServeConfig(data_dir=Path(sys.argv[1]), model=Path(sys.argv[2]),
                                  demo=False, admin_key="x" * 32))
print(server.engine.pid, flush=True)
os._exit(0)  # no cleanup: as if the server process had been killed
"""


def test_the_engine_process_exits_when_its_parent_dies(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path), str(demo_assets.base_model_dir)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    child = int(run.stdout.split()[-1])
    assert _wait_gone(child), f"engine process {child} outlived its parent"
