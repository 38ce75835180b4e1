"""Session locality: a conversation's requests go to the replica that holds its KV prefix.

A bounded table from session key (the OpenAI ``user`` field or a session header) to the replica
that served the session last; entries lapse after ``ttl_s`` unused, and the least recently used
go first past ``max_sessions``.
"""

from __future__ import annotations

from collections import OrderedDict


class SessionTable:
    """Session key → (replica id, last use)."""

    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self._ttl_s = ttl_s
        self._max_sessions = max_sessions
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, session_key: str, now_s: float) -> str | None:
        """The session's replica, or None when unknown or lapsed."""
        entry = self._entries.get(session_key)
        if entry is None:
            return None
        if now_s - entry[1] > self._ttl_s:
            del self._entries[session_key]
            return None
        return entry[0]

    def put(self, session_key: str, replica_id: str, now_s: float) -> None:
        self._entries[session_key] = (replica_id, now_s)
        self._entries.move_to_end(session_key)
        while len(self._entries) > self._max_sessions:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
