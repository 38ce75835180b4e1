"""End to end with a slow artifact store: a cold-load storm never stalls warm streams, and a client
that leaves while its adapter loads aborts its request. Loads are held at a gate, so the tests
assert ordering (what finished while the gate was closed), never timings.

NOTE: no bound here may be one a slow (loaded) machine reaches: the requests held at the gate
outlast the whole warm phase (their client's timeout and the queue deadline are ``HELD_S``),
and the client that leaves does so once its request waits for its adapter, not after a time."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from live import GatedStore, async_client, running

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.demo.assets import DemoAdapter, DemoAssets
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.factory import AdapterRuntimeConfig, build_adapter_runtime, build_engine
from loraplex.engine.transport.thread_client import AsyncEngine
from loraplex.registry import RegistryConfig, open_registry
from loraplex.residency.cache import TieredAdapterCache
from loraplex.serve.bootstrap import register_demo, sample_keys
from loraplex.serve.engine_settings import tenant_settings
from loraplex.serve.engine_side import RegistryResolver
from loraplex.server.app import create_app
from loraplex.server.chat import ChatTemplate
from loraplex.server.deps import ServerConfig, ServerDeps

ADMIN_KEY = "storm-admin-credential-0123456789"
HELD_S = 3600.0  # how long a request held at the gate may wait: far past any test's end
WAIT_S = 300.0  # what has not happened in this long on a loaded machine never will


@dataclass(frozen=True)
class Storm:
    url: str  # base URL
    keys: dict[str, str]  # tenant -> API key
    store: GatedStore  # holds cold loads until opened
    engine: AsyncEngine  # the real engine
    cache: TieredAdapterCache  # the real adapter cache
    assets: DemoAssets  # the demo set


@pytest.fixture
def storm(demo_assets: DemoAssets, tmp_path: Path) -> Iterator[Storm]:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    registry = open_registry(RegistryConfig(tmp_path), base=base)
    state = register_demo(registry, demo_assets)
    keys = sample_keys(registry, state.tenants, tmp_path)
    store = GatedStore(registry.store)
    runtime = build_adapter_runtime(
        base, RegistryResolver(registry, "float32"), store, tmp_path / "l2",
        AdapterRuntimeConfig(max_loras=4, max_concurrent_loads=8, tenant_max_concurrent_loads=8),
    )  # fmt: skip
    sched = SchedulerConfig(max_num_seqs=16, default_deadline_s=HELD_S)
    engine = build_engine(demo_assets.base_model_dir, EngineConfig(scheduler=sched), runtime)
    config = ServerConfig(base_model_name=base.name, admin_key=ADMIN_KEY, metrics_public=True)
    chat = ChatTemplate.from_model_dir(demo_assets.base_model_dir)
    deps = ServerDeps(
        config,
        engine,
        registry,
        runtime.cache,
        chat,
        refresh_tenants=lambda: runtime.update_tenant_settings(tenant_settings(registry)),
    )
    try:
        with running(create_app(deps)) as url:
            yield Storm(url, keys, store, engine, runtime.cache, demo_assets)
    finally:
        store.open()
        engine.shutdown()
        runtime.cache.close()
        registry.close()


async def _stream_probe(storm: Storm, adapter: DemoAdapter) -> tuple[str, int]:
    """The streamed text of ``adapter``'s probe and how many chunks carried it."""
    api = async_client(storm.url, storm.keys[adapter.tenant], timeout_s=HELD_S)
    async with api:
        stream = await api.completions.create(
            model=f"{adapter.name}@{adapter.revision}", prompt=adapter.probe_prompt,
            max_tokens=adapter.probe_max_tokens, temperature=0, stream=True,
        )  # fmt: skip
        parts = [choice.text async for chunk in stream for choice in chunk.choices]
        return "".join(parts), sum(1 for part in parts if part)


def test_cold_storm_never_stalls_warm_streams(storm: Storm) -> None:
    warm = storm.assets.adapter("acme", "support", "r1")
    cold = [a for a in storm.assets.adapters if a.tenant != "acme"]
    storm.store.close_for([a.key(storm.assets.base_digest) for a in cold])

    async def scenario() -> None:
        await _stream_probe(storm, warm)  # load it before the storm
        cold_tasks = [asyncio.ensure_future(_stream_probe(storm, a)) for a in cold]
        await _until(lambda: storm.engine.load_snapshot().num_adapter_wait == len(cold))
        for _ in range(3):
            text, num_chunks = await _stream_probe(storm, warm)
            assert text == warm.expected_continuation
            assert num_chunks >= 3  # tokens streamed one by one, not in a final burst
            assert not any(task.done() for task in cold_tasks)  # the storm is still held
        storm.store.open()
        results = await asyncio.gather(*cold_tasks)
        assert [text for text, _ in results] == [a.expected_continuation for a in cold]

    asyncio.run(scenario())


async def _until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_while_queued_aborts_the_request(storm: Storm, stream: bool) -> None:
    cold = storm.assets.adapter("globex", "translate", "r1")
    storm.store.close_for([cold.key(storm.assets.base_digest)])
    body = {"model": "translate", "prompt": cold.probe_prompt, "max_tokens": 4, "stream": stream}
    with _asking(storm.url, storm.keys["globex"], body):
        # NOTE: it leaves once its request waits for the adapter; a client timeout (1 s) could
        # pass before the request got there, and the abort below was then not counted yet
        asyncio.run(_until(lambda: storm.engine.load_snapshot().num_adapter_wait == 1))
    asyncio.run(_until(lambda: storm.engine.load_snapshot().num_adapter_wait == 0))
    aborted = 'requests_total{outcome="abort",priority_class="normal"} 1.0'
    asyncio.run(_until(lambda: aborted in httpx.get(f"{storm.url}/metrics").text))
    load = storm.engine.load_snapshot()
    assert (load.num_waiting, load.num_adapter_wait, load.num_running) == (0, 0, 0)
    storm.store.open()  # the abandoned load may finish; no lease may be left behind
    asyncio.run(_until(lambda: storm.cache.snapshot().num_loading == 0))
    # The engine releases an abandoned lease on its next step, once the load has granted it.
    asyncio.run(_until(lambda: all(e.refcount == 0 for e in storm.cache.snapshot().entries)))
    storm.cache.check_integrity()


@contextmanager
def _asking(url: str, key: str, body: dict[str, object]) -> Iterator[None]:
    """A client that has sent ``body`` to /v1/completions and reads nothing; it leaves (closes
    its connection) when the block ends."""
    address = urlsplit(url)
    with socket.create_connection((address.hostname or "", address.port or 0)) as sock:
        data = json.dumps(body).encode()
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        sock.sendall(head.encode() + data)
        yield
