"""A real uvicorn server on 127.0.0.1 (free port) in a thread, for end-to-end tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from openai import AsyncOpenAI, OpenAI
from prometheus_client import CollectorRegistry

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.store import ArtifactStore
from loraplex.demo.assets import DemoAssets
from loraplex.serve.assembly import DEMO_DIR, build_server
from loraplex.serve.config import ServeConfig
from loraplex.serve.front import Server
from loraplex.server.listeners import ConnectionLimits, ListenerConfig, bind


def exchange(address: tuple[str, int], wire: bytes, half_close: bool = False) -> bytes:
    """Sends ``wire`` on a new connection (then shuts its sending side when ``half_close``) and
    returns every byte received until the server closes it (a reset after the answer ends it
    too: the rest of a refused request was left unread)."""
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(wire)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


@contextmanager
def listening(
    app: Any,
    limits: ConnectionLimits,
    metrics: CollectorRegistry | None = None,
    *,
    log_level: str = "warning",
    access_log: bool = True,
) -> Iterator[tuple[str, uvicorn.Server]]:
    """Serves ``app`` as ``loraplex serve`` does (its own socket, ``ListenerConfig``, its counts
    in ``metrics`` when given) until the block ends; yields the base URL and the server (its
    ``server_state`` holds the connections). uvicorn's access lines are logged at "info"."""
    sock = bind("127.0.0.1", 0)
    config = ListenerConfig(
        app, limits, log_level=log_level, metrics=metrics, access_log=access_log
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def running(app: FastAPI) -> Iterator[str]:
    """Serves ``app`` with the default connection limits until the block ends; yields the URL."""
    with listening(app, ConnectionLimits()) as (url, _):
        yield url


@dataclass(frozen=True)
class Live:
    """The assembled server of ``loraplex serve``, listening on a free local port."""

    server: Server  # the assembled server
    url: str  # its base URL
    assets: DemoAssets  # the demo set it serves

    def key(self, tenant: str) -> str:
        return self.server.sample_keys[tenant]


@contextmanager
def live_server(assets: DemoAssets, data_dir: Path, **config: Any) -> Iterator[Live]:
    """``build_server`` on ``data_dir`` with the session's demo set adopted as the server's own
    (generating it again would take a minute), served until the block ends."""
    (data_dir / DEMO_DIR).symlink_to(assets.root, target_is_directory=True)
    server = build_server(ServeConfig(data_dir=data_dir, **config))
    try:
        with running(server.app) as url:
            yield Live(server, url, assets)
    finally:
        server.close()


def client(url: str, key: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def async_client(url: str, key: str, timeout_s: float = 60.0) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=timeout_s)


class GatedStore:
    """An ArtifactStore whose reads of gated digests wait until ``open()`` (a slow remote)."""

    def __init__(self, inner: ArtifactStore) -> None:
        self.inner = inner
        self.gated: set[str] = set()
        self._gate = threading.Event()

    def close_for(self, keys: list[AdapterKey]) -> None:
        self.gated |= {key.adapter_digest for key in keys}

    def open(self) -> None:
        self._gate.set()

    @property
    def url(self) -> str:
        return self.inner.url

    def put_file(self, path: Path, digest: str) -> None:
        self.inner.put_file(path, digest)

    def exists(self, digest: str) -> bool:
        return self.inner.exists(digest)

    def read(self, digest: str) -> Iterator[bytes]:
        if digest in self.gated:
            # NOTE: no timeout: a held read that went on by itself after 120 s would let the storm
            # through where a loaded machine's warm phase lasts longer (the fixture opens the
            # gate however the test ends)
            self._gate.wait()
        return self.inner.read(digest)

    def digests(self) -> Iterator[str]:
        return self.inner.digests()

    def delete(self, digest: str) -> None:
        self.inner.delete(digest)
