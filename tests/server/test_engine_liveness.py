"""An engine process's liveness (issue 25, the hung engine): a frozen child (SIGSTOP) with work
pending is declared hung within the liveness bound, long before the progress bound; the request
that had no output yet gets a fast 503 with Retry-After, the one already streaming waits and
completes once the child continues, and the abort held back for the refused one reaches the
child. A forward longer than the liveness bound is not a hang: the child's liveness thread beats
through it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import ADMIN_KEY, BASE_NAME, Served
from live import client, running
from slow_engine import slow_worker

from loraplex.demo.assets import DemoAssets
from loraplex.engine.transport.process import EngineProcess
from loraplex.model.tokenizer import TextTokenizer
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_settings import watchdog_policy
from loraplex.server.app import create_app
from loraplex.server.deps import ServerConfig, ServerDeps


def _until(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@contextmanager
def _serving(
    served: Served, demo_assets: DemoAssets, data_dir: Path, step_s: float, **values: object
) -> Iterator[tuple[EngineProcess, str]]:
    """The real engine side in a child whose steps take ``step_s`` longer, behind the app."""
    data_dir.mkdir(parents=True)
    model_dir = demo_assets.base_model_dir
    config = ServeConfig(
        data_dir=data_dir, model=model_dir, demo=False, admin_key=ADMIN_KEY, **values
    )  # type: ignore[arg-type]
    engine = EngineProcess(
        slow_worker,
        (step_s, config, model_dir),
        TextTokenizer(model_dir),
        watchdog=watchdog_policy(config),
    )
    try:
        settings = ServerConfig(base_model_name=BASE_NAME, admin_key=ADMIN_KEY)
        deps = ServerDeps(
            settings, engine, served.registry, engine.cache, refresh_tenants=lambda: None
        )
        with running(create_app(deps)) as url:
            yield engine, url
    finally:
        engine.shutdown()


class _Call:
    """``call`` on its own thread, its outcome (value or exception) and when it ended."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.outcome: object = None
        self.ended_s: float | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self.outcome = call()
        except Exception as exc:
            self.outcome = exc
        self.ended_s = time.monotonic()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self, timeout_s: float = 60.0) -> object:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive()
        return self.outcome


def _post(url: str, key: str, max_tokens: int) -> httpx.Response:
    body = {"model": BASE_NAME, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)


def test_a_frozen_engine_is_hung_at_once_unstarted_requests_get_503_streaming_ones_wait(
    served: Served, demo_assets: DemoAssets, tmp_path: Path
) -> None:
    key = next(iter(served.keys.values()))
    bounds = {"engine_unresponsive_after_s": 0.5, "engine_hung_after_s": 30.0,
              "engine_hung_kill_after_s": 60.0, "max_num_seqs": 1}  # fmt: skip
    with _serving(served, demo_assets, tmp_path / "data", 0.05, **bounds) as (engine, url):
        http = httpx.Client(base_url=url, timeout=30)
        api = client(url, key)
        _until("the engine never came up", lambda: http.get("/ready").status_code == 200)
        pid = engine.pid
        assert pid is not None
        first_token = threading.Event()

        def stream() -> int:  # 60 steps of at least 50 ms: still streaming when stopped
            chunks = api.completions.create(
                model=BASE_NAME, prompt="hello", max_tokens=60, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )  # fmt: skip
            tokens = 0
            for chunk in chunks:
                first_token.set()
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            return tokens

        streaming = _Call(stream)
        assert first_token.wait(60)
        # the only seat is taken: this one waits in the engine's queue, no output yet
        queued = _Call(lambda: _post(url, key, max_tokens=400))
        _until("the second request never queued", lambda: engine.load_snapshot().num_waiting == 1)
        os.kill(pid, signal.SIGSTOP)
        stopped_s = time.monotonic()
        try:
            refused = queued.result()
            assert isinstance(refused, httpx.Response) and refused.status_code == 503, refused
            assert "Retry-After" in refused.headers and "hung" in refused.text
            assert queued.ended_s is not None
            # the liveness bound (0.5 s), not the progress bound (30 s); generous for a busy box
            assert queued.ended_s - stopped_s < 15.0
            health = http.get("/health").json()
            assert health["engine"] == "hung" and "unresponsive" in health["reason"], health
            assert http.get("/ready").status_code == 503
            new = _post(url, key, max_tokens=2)
            assert new.status_code == 503 and "Retry-After" in new.headers
            time.sleep(1.0)
            assert streaming.running  # it waits for the child, it is not cut
        finally:
            os.kill(pid, signal.SIGCONT)
        assert streaming.result() == 60  # every token, after the stop
        _until("a continued engine stayed hung", lambda: http.get("/ready").status_code == 200)
        # the refused request's abort was held back and sent: it never takes the only seat
        _until("the refused request was not aborted in the child",
               lambda: engine.load_snapshot().num_running == 0, timeout_s=10.0)  # fmt: skip
        served_after = _post(url, key, max_tokens=3)
        assert served_after.status_code == 200
        assert served_after.json()["usage"]["completion_tokens"] == 3
        assert engine.pid == pid and engine.health().num_restarts == 0


def test_a_forward_longer_than_the_liveness_bound_is_not_a_hang(
    served: Served, demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Each step takes 1.5 s (three liveness bounds), far below the progress bound: the child's
    liveness thread beats through it, so the engine is never hung and the request completes."""
    key = next(iter(served.keys.values()))
    bounds = {"engine_unresponsive_after_s": 0.5, "engine_hung_after_s": 20.0}
    with _serving(served, demo_assets, tmp_path / "data", 1.5, **bounds) as (engine, url):
        http = httpx.Client(base_url=url, timeout=30)
        _until("the engine never came up", lambda: http.get("/ready").status_code == 200)
        call = _Call(lambda: _post(url, key, max_tokens=3))
        hung_seen = []
        while call.running:
            health = engine.health()
            if health.hung or not health.up:
                hung_seen.append(health.down_reason)
            time.sleep(0.02)
        done = call.result()
        assert isinstance(done, httpx.Response) and done.status_code == 200, done
        assert done.json()["usage"]["completion_tokens"] == 3
        assert hung_seen == []


def test_the_liveness_bound_is_checked_and_needs_an_engine_process(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"^engine_unresponsive_after_s 0 is invalid; expected > 0$"
    ):
        ServeConfig(data_dir=tmp_path, engine_unresponsive_after_s=0)
    with pytest.raises(ValueError, match=r"^engine_unresponsive_after_s 2 is invalid with"):
        ServeConfig(data_dir=tmp_path, engine_process=False, engine_unresponsive_after_s=2)
    config = ServeConfig(data_dir=tmp_path, engine_unresponsive_after_s=2)
    assert watchdog_policy(config).unresponsive_after_s == 2
