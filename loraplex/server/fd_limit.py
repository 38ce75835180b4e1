"""File descriptors for the connections the server promises to hold.

Every open connection, every held one (``tarpit.py``) and every one waiting for room
(``connections.py``, ``MAX_WAITING``) is a file descriptor, beside the
listeners, the engine child's pipes, adapter files being read and the registry's connections.
A process whose soft ``RLIMIT_NOFILE`` is below that cannot accept past it: asyncio logs
"out of system resource" and stops accepting for a while, for every tenant at once, so the
connection caps would be promises the process cannot keep. At start the soft limit is raised
to what the caps need (never above the hard limit); when even the hard limit is too low the
server refuses to start, naming the settings to lower.
"""

from __future__ import annotations

import resource

RESERVED_FDS = 256  # listeners, engine pipes, adapter files, logs, registry connections


def needed_fds(max_connections: int, max_held: int) -> int:
    """Descriptors the caps can use at once: open connections, held or waiting ones
    (``max_held``), the reserve."""
    return max_connections + max_held + RESERVED_FDS


def ensure_fd_limit(max_connections: int, max_held: int) -> int:
    """Raises the soft ``RLIMIT_NOFILE`` to :func:`needed_fds` when below it; returns the soft
    limit now in force. ValueError when the hard limit is below what the caps need."""
    needed = needed_fds(max_connections, max_held)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ValueError(
            f"max_connections {max_connections} is invalid here: with {max_held} held or waiting "
            f"connections and {RESERVED_FDS} reserved it needs {needed} file descriptors, and "
            f"this process's hard RLIMIT_NOFILE is {hard}; expected a lower max_connections or "
            "a higher limit (ulimit -Hn)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed
