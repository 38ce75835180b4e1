"""Liveness vs readiness while the engine process starts: /health answers 200 at once (the HTTP
server is up), /ready answers 503 until the engine takes requests; a first start that fails is
raised by ``wait_started`` / ``Server.wait_engine`` (the child's own error) and not retried."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import ADMIN_KEY, BASE_NAME, Served
from fastapi.testclient import TestClient
from gated_engine import FAIL, gated_worker

from loraplex.demo.assets import DemoAssets
from loraplex.engine.transport.process import EngineProcess
from loraplex.errors import EngineUnavailableError
from loraplex.model.tokenizer import TextTokenizer
from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig
from loraplex.server.app import create_app
from loraplex.server.deps import ServerConfig, ServerDeps


def _config(demo_assets: DemoAssets, data_dir: Path, **values: object) -> ServeConfig:
    data_dir.mkdir(parents=True, exist_ok=True)
    model_dir = demo_assets.base_model_dir
    return ServeConfig(
        data_dir=data_dir, model=model_dir, demo=False, admin_key=ADMIN_KEY, **values
    )  # type: ignore[arg-type]


@contextmanager
def _starting(
    served: Served, demo_assets: DemoAssets, gate: Path
) -> Iterator[tuple[EngineProcess, TestClient]]:
    model_dir = demo_assets.base_model_dir
    config = _config(demo_assets, gate.parent / "data")
    engine = EngineProcess(
        gated_worker, (gate, config, model_dir), TextTokenizer(model_dir), wait_ready=False
    )
    try:
        settings = ServerConfig(base_model_name=BASE_NAME, admin_key=ADMIN_KEY)
        deps = ServerDeps(
            settings, engine, served.registry, engine.cache, refresh_tenants=lambda: None
        )
        with TestClient(create_app(deps)) as client:
            yield engine, client
    finally:
        engine.shutdown()


def test_health_answers_while_the_engine_starts_and_ready_waits_for_it(
    served: Served, demo_assets: DemoAssets, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with _starting(served, demo_assets, gate) as (engine, client):
        health = client.get("/health")
        assert health.status_code == 200
        assert health.json()["status"] == "starting" and health.json()["engine"] == "starting"
        assert "starting" in health.json()["reason"]
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["reason"] == "EngineUnavailableError"
        assert "Retry-After" in ready.headers

        gate.write_text("open")
        engine.wait_started(300)
        assert client.get("/ready").json() == {"status": "ready"}
        assert client.get("/health").json() == {"status": "ok"}


def test_a_failed_first_start_is_raised_and_not_retried(
    served: Served, demo_assets: DemoAssets, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with _starting(served, demo_assets, gate) as (engine, client):
        gate.write_text(FAIL)
        with pytest.raises(ValueError, match="expected the gate to open"):
            engine.wait_started(300)
        failed = client.get("/health")  # the server lives on; its engine is down, not starting
        assert failed.status_code == 200 and failed.json()["engine"] == "down"
        ready = client.get("/ready")
        assert ready.status_code == 503 and "failed to start" in ready.json()["detail"]
        assert engine.health().num_restarts == 0
        assert not [p for p in multiprocessing.active_children() if p.pid == engine.pid]


def test_build_server_can_leave_the_engine_starting(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    server = build_server(_config(demo_assets, tmp_path, device="cuda:99"), wait_engine=False)
    try:
        assert server.deps.engine.health().up is False  # returned before the engine was up
        with pytest.raises(Exception) as failed:
            server.wait_engine(300)
        assert not isinstance(failed.value, EngineUnavailableError)  # the child's own error
    finally:
        server.close()
