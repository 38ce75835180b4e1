"""Where the server listens: the public API and, optionally, a separate admin address.

With ``admin_port`` set, one uvicorn server serves two sockets and ``AdminBindGuard`` splits
the routes by the socket a request arrived on: every route that needs the admin credential
(``/admin``, vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``) and ``/metrics``
only on the admin socket (bind it to a private interface), everything else only on the public
one; ``/health``, ``/ready`` and ``/version`` on both. A route asked on the wrong socket gets the
same 404 as a path that does not exist. Credentials still apply on both sockets.
"""

from __future__ import annotations

import socket
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from loraplex.server.auth import DASHBOARD_PATHS, Credential, required_credential
from loraplex.server.errors import no_route

_BOTH = ("/health", "/ready", "/version")


def is_admin_path(path: str) -> bool:
    """Served on the admin socket only (when there is one); the dashboard's public files too."""
    if path == "/metrics" or path in DASHBOARD_PATHS:
        return True
    return required_credential(path) is Credential.ADMIN


class AdminBindGuard:
    """ASGI middleware: admin routes only on ``admin_port``, the others only elsewhere."""

    def __init__(self, app: ASGIApp, admin_port: int) -> None:
        self.app = app
        self.admin_port = admin_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in _BOTH:
            server = scope.get("server")
            on_admin = server is not None and server[1] == self.admin_port
            if is_admin_path(scope["path"]) != on_admin:
                # NOTE: the body of the router's own 404 (``errors.no_route``), so a tenant cannot
                # tell a route of the other socket from a path that does not exist.
                await no_route().response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.setblocking(False)
    return sock


def bind_all(
    host: str, port: int, admin_host: str | None, admin_port: int | None
) -> list[socket.socket]:
    """The public socket, then the admin socket when ``admin_port`` is set."""
    sockets = [bind(host, port)]
    if admin_port is not None:
        try:
            sockets.append(bind(admin_host or host, admin_port))
        except OSError:
            sockets[0].close()
            raise
    return sockets


def guarded(app: Any, sockets: list[socket.socket]) -> Any:
    """``app`` split between the sockets of ``bind_all`` (unchanged with one socket)."""
    if len(sockets) < 2:
        return app
    return AdminBindGuard(app, sockets[1].getsockname()[1])
