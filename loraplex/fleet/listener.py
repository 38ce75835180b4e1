"""The fleet's public HTTP listener: ``loraplex serve``'s own (``server/listeners``), run by the
ingress replica in its process, so every connection bound of ``serve`` holds in a fleet too.

``IngressListener`` binds ``serve.host:serve.port`` (as ``serve`` binds: no SO_REUSEPORT, so a
second fleet on the port fails instead of sharing it) and serves the ingress's app with the same
``ListenerConfig`` and ``ConnectionLimits`` as ``serve`` (``serve/front.connection_limits``,
from the same ``ServeConfig`` keys): head deadline and size, connection gate and tarpit, idle
keep-alive, write timeout, send buffer, half-close. uvicorn runs on a thread of its own with its
own event loop: Ray Serve's handles (the engine deployment, the board) are awaitable from any
loop, and the fleet link runs on its own thread already (``link.py``).

With ``admin_port`` set it binds the admin socket too and splits the routes between the two as
``serve`` does (``bind_all``, ``guarded``: admin routes and ``/metrics`` on the admin socket
only). It also answers ``GET /-/healthz`` (200 ``success``) ahead of the app, without a
credential, on both sockets: the path where KubeRay asks a node's Serve HTTP endpoint whether the
head pod belongs in the RayService's Service (Ray's proxy answered it before).

With it, Ray Serve starts no HTTP proxy (``control.deploy``, ``proxy_location: Disabled``):
nothing reads a body ahead of the ingress, and no request header of Ray's changes a request's
timeout or disconnect handling.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

from loraplex.serve.config import ServeConfig
from loraplex.serve.front import Server, connection_limits
from loraplex.server.listeners import ListenerConfig, bind_all, guarded

START_TIMEOUT_S = 30.0  # uvicorn must be serving this long after the thread started
STOP_TIMEOUT_S = 10.0  # a stop waits this long for uvicorn to close its connections
PROXY_HEALTH_PATH = "/-/healthz"  # KubeRay's check of a Ray node's Serve HTTP endpoint


class ProxyHealth:
    """ASGI middleware: ``GET /-/healthz`` answers 200 ``success`` (liveness of this listener,
    as Ray's proxy answered it); every other request goes to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == PROXY_HEALTH_PATH
            and scope["method"] in ("GET", "HEAD")
        ):
            headers = [(b"content-type", b"text/plain"), (b"content-length", b"7")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"success"})
            return
        await self.app(scope, receive, send)


class IngressListener:
    """uvicorn with loraplex's bounded protocol on ``config.host:config.port`` (and
    ``config.admin_host:config.admin_port`` when set), on its own thread, serving ``server``'s
    app until ``stop``."""

    def __init__(self, config: ServeConfig, server: Server) -> None:
        self._sockets = bind_all(config.host, config.port, config.admin_host, config.admin_port)
        app = ProxyHealth(guarded(server.app, self._sockets))  # guarded reads the admin port
        try:  # raises on a connection cap the descriptors cannot hold
            listener_config = ListenerConfig(
                app,
                connection_limits(config),
                log_level=config.log_level,
                metrics=server.deps.metrics.registry,
                access_log=config.access_log,
            )
        except BaseException:
            for sock in self._sockets:
                sock.close()
            raise
        self._uvicorn = uvicorn.Server(listener_config)
        self._failure: BaseException | None = None  # what ended the thread, if anything did
        self._thread = threading.Thread(
            target=self._run, name="loraplex-ingress-listener", daemon=True
        )
        self._thread.start()
        self._wait_started()

    def _run(self) -> None:
        try:
            self._uvicorn.run(sockets=self._sockets)
        except BaseException as exc:  # NOTE: uvicorn exits with SystemExit on a start failure
            self._failure = exc
        finally:
            for sock in self._sockets:
                sock.close()

    def _wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the ingress listener did not start: {self._failure!r}")
            time.sleep(0.01)

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the bound port when ``config.port`` was 0)."""
        host, port = self._sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def admin_address(self) -> tuple[str, int] | None:
        """Where its admin socket listens; None without ``admin_port``."""
        if len(self._sockets) < 2:
            return None
        host, port = self._sockets[1].getsockname()[:2]
        return str(host), int(port)

    def check(self) -> None:
        """RuntimeError unless it is serving (the ingress's health check: Ray Serve replaces an
        ingress whose listener ended)."""
        if not self._thread.is_alive() or self._uvicorn.should_exit:
            raise RuntimeError(f"the ingress listener is not serving: {self._failure!r}")

    def stop(self) -> None:
        """Stops accepting, closes connections (uvicorn's shutdown), waits up to
        ``STOP_TIMEOUT_S``; the socket is closed when the thread ends."""
        self._uvicorn.should_exit = True
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT_S)
