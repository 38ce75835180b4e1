"""Where the server listens and how each client connection is bounded.

- ``sockets.py``: the public socket and, optionally, a separate admin socket, with the routes
  split between them (``AdminBindGuard``);
- ``limits.py``: what a client connection may hold (``ConnectionLimits``);
- ``protocol.py``: uvicorn's h11 protocol bounded by those limits and the connection gate
  (``BoundedH11Protocol``), and the uvicorn config that carries them (``ListenerConfig``);
- ``h11_bounds.py``: h11's parser bounded where h11 is not (request head, body chunks);
- ``linger.py``: the staged close of a connection answered before its request body ended.
"""

from loraplex.server.listeners.limits import ConnectionLimits
from loraplex.server.listeners.protocol import BoundedH11Protocol, ListenerConfig
from loraplex.server.listeners.sockets import (
    AdminBindGuard,
    bind,
    bind_all,
    guarded,
    is_admin_path,
)

__all__ = [
    "AdminBindGuard",
    "BoundedH11Protocol",
    "ConnectionLimits",
    "ListenerConfig",
    "bind",
    "bind_all",
    "guarded",
    "is_admin_path",
]
