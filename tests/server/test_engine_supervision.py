"""The engine process is supervised: a killed child fails its live requests with an error naming
the restart (never a hang), /ready says so (/health stays 200: the server itself is alive), new
requests get a fast 503 with Retry-After, a new child comes back after a bounded backoff with the
tenant settings changed meanwhile, the adapter cache proxy answers from it, /metrics counts the
restart, and nothing of the dead child is left behind."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from live import Live, client, live_server
from prometheus_client.parser import text_string_to_metric_families

from loraplex.demo.assets import DemoAssets
from loraplex.engine.transport.process import EngineProcess
from loraplex.engine.transport.restart import Backoff, RestartPolicy

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
LONG = {"max_tokens": 480, "extra_body": {"ignore_eos": True}}


# --- backoff ---------------------------------------------------------------------------------


def test_backoff_doubles_to_its_cap_and_resets_after_a_healthy_run() -> None:
    backoff = Backoff(RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, healthy_reset_s=60))
    backoff.up(0.0)
    assert backoff.next_delay_s(10.0) == 0.5  # the first crash
    assert [backoff.next_delay_s(11.0) for _ in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.up(20.0)
    assert backoff.next_delay_s(30.0) == 4.0  # up 10 s only: still a crash loop
    backoff.up(40.0)
    assert backoff.next_delay_s(100.0) == 0.5  # up 60 s: a fresh start
    assert backoff.next_delay_s(101.0) == 1.0


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"initial_backoff_s": 0}, "initial_backoff_s"),
        ({"max_backoff_s": -1}, "max_backoff_s"),
        ({"healthy_reset_s": 0}, "healthy_reset_s"),
        ({"initial_backoff_s": 5, "max_backoff_s": 1}, "max_backoff_s"),
    ],
)
def test_a_bad_restart_policy_is_refused_naming_its_field(
    values: dict[str, float], field: str
) -> None:
    with pytest.raises(ValueError, match=f"^{field} .* is invalid"):
        RestartPolicy(**values)


# --- a killed engine process -----------------------------------------------------------------


def _engine(live: Live) -> EngineProcess:
    engine = live.server.engine
    assert isinstance(engine, EngineProcess)
    return engine


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as alive: it leaked)."""
    return Path(f"/proc/{pid}").exists()


def _ipc_fds() -> tuple[int, int]:
    """(pipes, unix sockets) this process holds: the engine pipe is a unix socket pair and each
    child's sentinel a pipe (the HTTP connections are TCP)."""
    unix = {line.split()[-2] for line in Path("/proc/net/unix").read_text().splitlines()[1:]}
    pipes = sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        pipes += target.startswith("pipe:")
        sockets += target.startswith("socket:[") and target[8:-1] in unix
    return pipes, sockets


def _engine_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("loraplex-engine"))


def _metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics", headers=AUTH).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


def _wait_ready(http: httpx.Client, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while http.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, "the engine process did not come back"
        time.sleep(0.05)


def _wait_running(engine: EngineProcess, count: int) -> None:
    deadline = time.monotonic() + 30
    while engine.load_snapshot().num_running < count:
        assert time.monotonic() < deadline, f"{count} requests never ran together"
        time.sleep(0.01)


def test_a_killed_engine_process_fails_live_requests_and_comes_back(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    adapter = demo_assets.adapters[0]
    ref = f"{adapter.tenant}/{adapter.name}@{adapter.revision}"
    threads_before, children_before = _engine_threads(), set(_children())
    with live_server(demo_assets, tmp_path, admin_key=ADMIN) as live:
        engine = _engine(live)
        http = httpx.Client(base_url=live.url, timeout=10)
        api = client(live.url, live.key(adapter.tenant))
        stream = api.completions.create(
            model=adapter.name, prompt=adapter.probe_prompt, stream=True, **LONG
        )
        assert next(iter(stream)).choices[0].text is not None
        failures: list[BaseException] = []

        def blocking_request() -> None:
            try:
                api.completions.create(model=adapter.name, prompt="hello", **LONG)
            except BaseException as exc:
                failures.append(exc)

        waiter = threading.Thread(target=blocking_request)
        waiter.start()
        _wait_running(engine, 2)
        before = (_ipc_fds(), _engine_threads())
        dead = engine.pid
        assert dead is not None
        os.kill(dead, signal.SIGKILL)

        with pytest.raises(openai.APIError, match="restart"):  # an error event, not a hang
            for _ in stream:
                pass
        waiter.join(30)
        assert len(failures) == 1 and isinstance(failures[0], openai.APIStatusError)
        assert failures[0].status_code == 503 and "restart" in failures[0].message

        health = http.get("/health")  # liveness: this server is fine, its engine is not
        assert health.status_code == 200, health.text
        assert health.json()["engine"] == "down" and "SIGKILL" in health.json()["reason"]
        ready = http.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["reason"] == "EngineUnavailableError"
        assert "SIGKILL" in ready.json()["detail"]
        refused = http.post(
            "/v1/completions", headers={"Authorization": f"Bearer {live.key(adapter.tenant)}"},
            json={"model": adapter.name, "prompt": "hello", "max_tokens": 2},
        )  # fmt: skip
        assert refused.status_code == 503 and "Retry-After" in refused.headers
        assert "restart" in refused.json()["error"]["message"]
        assert _metric(http, "loraplex_engine_up") == 0
        # saved now (as `tenants update` does: the admin API refuses a cap below one slot),
        # applied by the next engine
        live.server.registry.set_tenant_limits(adapter.tenant, "cli", None, {"max_gpu_bytes": 1})

        _wait_ready(http)
        assert http.get("/health").json() == {"status": "ok"}
        pin = {"model": ref, "tier": "L0", "wait": True}
        refused = http.post("/admin/residency/pin", json=pin, headers=AUTH)
        assert refused.status_code == 422, refused.text
        assert "tenant cap max_gpu_bytes 1 of tenant" in refused.text, refused.text
        roomy = {"quotas": {"max_gpu_bytes": 1 << 30}}
        assert http.put(f"/admin/tenants/{adapter.tenant}", json=roomy, headers=AUTH).is_success
        done = api.completions.create(model=adapter.name, prompt=adapter.probe_prompt,
                                      max_tokens=5, extra_body={"ignore_eos": True})  # fmt: skip
        assert done.choices[0].finish_reason == "length"
        assert done.usage is not None and done.usage.completion_tokens == 5
        assert _metric(http, "loraplex_engine_restarts_total") == 1
        assert _metric(http, "loraplex_engine_up") == 1
        residency = http.get("/admin/residency", headers=AUTH)  # the cache proxy re-attached
        assert residency.status_code == 200, residency.text
        assert engine.pid != dead and not _pid_alive(dead)  # reaped
        assert (_ipc_fds(), _engine_threads()) == before

        os.kill(engine.pid, signal.SIGKILL)  # and the server stops during the restart backoff
        restarting = engine.pid
    assert not _pid_alive(restarting)
    assert _engine_threads() == threads_before
    assert set(_children()) <= children_before


def _children() -> list[int]:
    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]
