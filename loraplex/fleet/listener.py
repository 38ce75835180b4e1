"""The fleet's public HTTP listener: ``loraplex serve``'s own (``server/listeners``), run by the
ingress replica in its process, so every connection bound of ``serve`` holds in a fleet too.

``IngressListener`` binds ``serve.host:serve.port`` (as ``serve`` binds: no SO_REUSEPORT, so a
second fleet on the port fails instead of sharing it) and serves the ingress's app with the same
``ListenerConfig`` and ``ConnectionLimits`` as ``serve`` (``cli/serve_start.connection_limits``,
from the same ``ServeConfig`` keys): head deadline and size, connection gate and tarpit, idle
keep-alive, write timeout, send buffer, half-close. uvicorn runs on a thread of its own with its
own event loop: Ray Serve's handles (the engine deployment, the board) are awaitable from any
loop, and the fleet link runs on its own thread already (``link.py``).

With it, Ray Serve starts no HTTP proxy (``control.deploy``): nothing reads a body ahead of the
ingress, and no request header of Ray's changes a request's timeout or disconnect handling.
"""

from __future__ import annotations

import threading
import time

import uvicorn

from loraplex.cli.serve_start import connection_limits
from loraplex.serve.config import ServeConfig
from loraplex.serve.front import Server
from loraplex.server.listeners import ListenerConfig, bind

START_TIMEOUT_S = 30.0  # uvicorn must be serving this long after the thread started
STOP_TIMEOUT_S = 10.0  # a stop waits this long for uvicorn to close its connections


class IngressListener:
    """uvicorn with loraplex's bounded protocol on ``config.host:config.port``, on its own
    thread, serving ``server``'s app until ``stop``."""

    def __init__(self, config: ServeConfig, server: Server) -> None:
        listener_config = ListenerConfig(
            server.app, connection_limits(config), metrics=server.deps.metrics.registry
        )  # raises before anything is bound (a connection cap the descriptors cannot hold)
        self._sock = bind(config.host, config.port)
        self._uvicorn = uvicorn.Server(listener_config)
        self._failure: BaseException | None = None  # what ended the thread, if anything did
        self._thread = threading.Thread(
            target=self._run, name="loraplex-ingress-listener", daemon=True
        )
        self._thread.start()
        self._wait_started()

    def _run(self) -> None:
        try:
            self._uvicorn.run(sockets=[self._sock])
        except BaseException as exc:  # NOTE: uvicorn exits with SystemExit on a start failure
            self._failure = exc
        finally:
            self._sock.close()

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
        host, port = self._sock.getsockname()[:2]
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
