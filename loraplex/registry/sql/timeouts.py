"""How long the registry waits on a PostgreSQL server, and on how many connections at most
(psycopg-free, so configs can check it).

Without limits a hung server, a lock held by another client or a dead connection blocks the
calling thread (a server worker, the CLI) forever. Each limit is a config key
(``database_connect_timeout_s``, ``database_statement_timeout_s``, ``database_lock_timeout_s``);
unset keys take the defaults below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_STATEMENT_TIMEOUT_S = 10.0
DEFAULT_LOCK_TIMEOUT_S = 5.0
# libpq (and psycopg) count connect_timeout in whole seconds and raise anything below 2 to 2.
MIN_CONNECT_TIMEOUT_S = 2
MAX_TIMEOUT_S = 3600.0  # an hour: beyond it a limit no longer bounds a request
# The server reports a statement timeout itself; the client waits this much longer for that
# report before it gives the server up (a frozen process or host never reports anything).
CLIENT_GRACE_S = 2.0
# Connections one process opens at most (``database_pool_size``): a call waiting on the server
# (a lock another client holds, a slow listing) holds one, and the others serve on. Opened as
# calls need them, kept open once opened; 64 bounds a process's share of the server's
# max_connections (100 by default).
DEFAULT_POOL_SIZE = 4
MAX_POOL_SIZE = 64


@dataclass(frozen=True)
class DatabaseTimeouts:
    """The limits of one registry connection; messages name the config keys (``database_*``)."""

    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S  # TCP connect + startup + login
    statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S  # one statement, lock waits included
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S  # one wait for a row, table or advisory lock

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "statement_timeout_s", "lock_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"database_{name} {value!r} is invalid; expected a number")
            if not (math.isfinite(value) and 0.001 <= value <= MAX_TIMEOUT_S):
                raise ValueError(
                    f"database_{name} {value} is invalid; expected 0.001 to {MAX_TIMEOUT_S:g} "
                    "seconds"
                )
        connect = self.connect_timeout_s
        if connect != int(connect) or connect < MIN_CONNECT_TIMEOUT_S:
            raise ValueError(
                f"database_connect_timeout_s {connect} is invalid; expected whole seconds >= "
                f"{MIN_CONNECT_TIMEOUT_S} (libpq's resolution and minimum)"
            )
        if self.lock_timeout_s > self.statement_timeout_s:
            raise ValueError(
                f"database_lock_timeout_s {self.lock_timeout_s} is invalid; expected <= "
                f"database_statement_timeout_s {self.statement_timeout_s} (a lock wait is part "
                "of a statement: the statement timeout would always fire first)"
            )

    @property
    def client_wait_s(self) -> float:
        """The longest the client waits for one answer from the server."""
        return self.statement_timeout_s + CLIENT_GRACE_S


def database_timeouts(
    connect_timeout_s: float | None, statement_timeout_s: float | None, lock_timeout_s: float | None
) -> DatabaseTimeouts:
    """The limits with unset (None) keys at their defaults (an unset lock timeout at most the
    statement timeout); ValueError naming a bad key."""
    connect = DEFAULT_CONNECT_TIMEOUT_S if connect_timeout_s is None else connect_timeout_s
    statement = DEFAULT_STATEMENT_TIMEOUT_S if statement_timeout_s is None else statement_timeout_s
    if lock_timeout_s is None and isinstance(statement, int | float):
        lock_timeout_s = min(DEFAULT_LOCK_TIMEOUT_S, statement)
    lock = DEFAULT_LOCK_TIMEOUT_S if lock_timeout_s is None else lock_timeout_s
    return DatabaseTimeouts(connect, statement, lock)


def database_pool_size(value: int | None) -> int:
    """The pool size (None: the default); ValueError naming ``database_pool_size``."""
    if value is None:
        return DEFAULT_POOL_SIZE
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_POOL_SIZE:
        raise ValueError(
            f"database_pool_size {value!r} is invalid; expected a whole number 1 to {MAX_POOL_SIZE}"
        )
    return value
