"""Session locality: a conversation's requests go to the replica that holds its KV prefix.

A bounded table from session key (the OpenAI ``user`` field or a session header) to the replica
that served the session last, each session owned by its tenant (None: a caller that names none);
entries lapse after ``ttl_s`` unused. Past ``max_sessions`` one session goes: the least recently
used of all when it has lapsed, else the least recently used of the owner holding the most
sessions (ties: the owner that reached that count first), as the connection gate makes room.
NOTE: one least-recently-used order over every tenant let a tenant sending fresh session ids
push every other tenant's sessions out, so their conversations lost their replica (and KV
prefix) however few sessions they kept (``scripts/attacks/fleetattack/session-flood``).
"""

from __future__ import annotations

from collections import OrderedDict


class SessionTable:
    """Session key → (replica id, last use, owner)."""

    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self._ttl_s = ttl_s
        self._max_sessions = max_sessions
        self._entries: OrderedDict[str, tuple[str, float, str | None]] = OrderedDict()
        self._owned: dict[str | None, OrderedDict[str, None]] = {}  # owner -> its keys, LRU
        # count -> the owners holding that many sessions, in the order they reached it
        self._by_count: dict[int, dict[str | None, None]] = {}
        self._most = 0  # the largest count held

    def get(self, session_key: str, now_s: float) -> str | None:
        """The session's replica, or None when unknown or lapsed."""
        entry = self._entries.get(session_key)
        if entry is None:
            return None
        if now_s - entry[1] > self._ttl_s:
            self._remove(session_key)
            return None
        return entry[0]

    def put(
        self, session_key: str, replica_id: str, now_s: float, owner: str | None = None
    ) -> None:
        old = self._entries.get(session_key)
        if old is not None and old[2] == owner:
            self._owned[owner].move_to_end(session_key)
        else:
            if old is not None:  # the same key under another owner: moves to the new one
                self._disown(session_key, old[2])
            self._own(session_key, owner)
        self._entries[session_key] = (replica_id, now_s, owner)
        self._entries.move_to_end(session_key)
        while len(self._entries) > self._max_sessions:
            self._drop_one(now_s)

    def count(self, owner: str | None) -> int:
        """Sessions ``owner`` holds."""
        return len(self._owned.get(owner, ()))

    def __len__(self) -> int:
        return len(self._entries)

    def _drop_one(self, now_s: float) -> None:
        oldest, (_, last_s, _) = next(iter(self._entries.items()))
        if now_s - last_s > self._ttl_s:
            self._remove(oldest)
            return
        owner = next(iter(self._by_count[self._most]))
        self._remove(next(iter(self._owned[owner])))

    def _remove(self, session_key: str) -> None:
        _, _, owner = self._entries.pop(session_key)
        self._disown(session_key, owner)

    def _own(self, session_key: str, owner: str | None) -> None:
        keys = self._owned.setdefault(owner, OrderedDict())
        count = len(keys)
        keys[session_key] = None
        if count:
            self._leave(count, owner)
        self._by_count.setdefault(count + 1, {})[owner] = None
        self._most = max(self._most, count + 1)

    def _disown(self, session_key: str, owner: str | None) -> None:
        keys = self._owned[owner]
        count = len(keys)
        del keys[session_key]
        self._leave(count, owner)
        if count > 1:
            self._by_count.setdefault(count - 1, {})[owner] = None
        else:
            del self._owned[owner]
        if count == self._most and count not in self._by_count:
            self._most = count - 1  # this owner holds count - 1 now (or nobody holds any)

    def _leave(self, count: int, owner: str | None) -> None:
        owners = self._by_count[count]
        del owners[owner]
        if not owners:
            del self._by_count[count]
