"""``SessionTable``: bounded, lapsing, and shared between tenants (past ``max_sessions`` the
tenant holding the most sessions loses its least recently used one, a lapsed session first)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from router_kit import make_router, report, req

from loraplex.router import Reason
from loraplex.router.sessions import SessionTable


def test_a_flooding_owner_pushes_out_only_its_own_sessions() -> None:
    table = SessionTable(ttl_s=600.0, max_sessions=4)
    table.put("globex/chat", "r1", 0.0, "globex")
    for i in range(100):
        table.put(f"acme/{i}", "r2", 1.0 + i, "acme")
    assert table.get("globex/chat", 200.0) == "r1"
    assert len(table) == 4 and table.count("acme") == 3 and table.count("globex") == 1
    assert [table.get(f"acme/{i}", 200.0) for i in (96, 97, 98, 99)] == [None, "r2", "r2", "r2"]


def test_a_lapsed_session_goes_before_a_live_one() -> None:
    table = SessionTable(ttl_s=10.0, max_sessions=3)
    table.put("initech/old", "r1", 0.0, "initech")
    table.put("acme/1", "r1", 5.0, "acme")
    table.put("acme/2", "r1", 6.0, "acme")
    table.put("globex/1", "r1", 11.0, "globex")  # initech's is lapsed: it goes, not acme's
    assert table.count("initech") == 0 and table.count("acme") == 2
    table.put("globex/2", "r1", 12.0, "globex")  # none lapsed: acme holds the most
    assert table.count("acme") == 1 and table.get("acme/1", 12.0) is None


def test_between_owners_at_the_same_count_the_first_to_reach_it_loses() -> None:
    table = SessionTable(ttl_s=600.0, max_sessions=4)
    table.put("acme/1", "r", 0.0, "acme")
    table.put("globex/1", "r", 1.0, "globex")
    table.put("globex/2", "r", 2.0, "globex")  # globex reaches 2 first
    table.put("acme/2", "r", 3.0, "acme")
    table.put("initech/1", "r", 4.0, "initech")
    assert table.get("globex/1", 5.0) is None and table.get("acme/1", 5.0) == "r"


def test_a_key_put_by_another_owner_moves_to_it() -> None:
    table = SessionTable(ttl_s=600.0, max_sessions=8)
    table.put("s", "r1", 0.0, "acme")
    table.put("s", "r2", 1.0, "globex")
    assert table.count("acme") == 0 and table.count("globex") == 1 and table.get("s", 2.0) == "r2"
    table.put("s", "r3", 2.0, None)  # a caller naming no tenant is an owner of its own
    assert table.count("globex") == 0 and table.count(None) == 1 and len(table) == 1


def test_a_router_keeps_another_tenants_session_through_a_flood() -> None:
    # NOTE: no saturation: the reports never change here, so every routed request stays
    # pending load (in a fleet reports come every second and the flood is spread over time)
    router, _ = make_router(max_sessions=4, max_queued=1000, max_ongoing=1000)
    fleet = {r: report(r) for r in ("a", "b", "c", "d")}
    first = router.choose(req(None, session="chat", tenant="globex"), fleet).replica_id
    for i in range(50):
        router.choose(req(None, session=f"flood-{i}", tenant="acme"), fleet)
    again = router.choose(req(None, session="chat", tenant="globex"), fleet)
    assert again.reason is Reason.SESSION and again.replica_id == first


class _Reference:
    """The table's rule written plainly: one list in use order, counts recomputed each time."""

    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self.entries: dict[str, tuple[str, float, str | None]] = {}  # in use order
        self.changed: dict[str | None, int] = {}  # owner -> when its count last changed
        self.clock = 0

    def _tick(self, owner: str | None) -> None:
        self.clock += 1
        self.changed[owner] = self.clock

    def get(self, key: str, now_s: float) -> str | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if now_s - entry[1] > self.ttl_s:
            del self.entries[key]
            self._tick(entry[2])
            return None
        return entry[0]

    def put(self, key: str, replica: str, now_s: float, owner: str | None) -> None:
        old = self.entries.pop(key, None)
        if old is None or old[2] != owner:
            if old is not None:
                self._tick(old[2])
            self._tick(owner)
        self.entries[key] = (replica, now_s, owner)
        while len(self.entries) > self.max_sessions:
            oldest = next(iter(self.entries))
            if now_s - self.entries[oldest][1] > self.ttl_s:
                victim = oldest
            else:
                counts: dict[str | None, int] = {}
                for _, _, o in self.entries.values():
                    counts[o] = counts.get(o, 0) + 1
                most = max(counts.values())
                loser = min((o for o in counts if counts[o] == most), key=self.changed.__getitem__)
                victim = next(k for k, e in self.entries.items() if e[2] == loser)
            self._tick(self.entries.pop(victim)[2])


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(0, 9),
            st.sampled_from(["acme", "globex", "initech", None]),
            st.floats(0.0, 4.0),
        ),
        max_size=80,
    ),
)
def test_the_table_matches_its_plain_rule(
    max_sessions: int, ops: list[tuple[bool, int, str | None, float]]
) -> None:
    table, reference = SessionTable(5.0, max_sessions), _Reference(5.0, max_sessions)
    now_s = 0.0
    for is_put, number, owner, step_s in ops:
        now_s += step_s
        key = f"s{number}"
        if is_put:
            table.put(key, f"r{number % 3}", now_s, owner)
            reference.put(key, f"r{number % 3}", now_s, owner)
        else:
            assert table.get(key, now_s) == reference.get(key, now_s)
        assert len(table) == len(reference.entries) <= max_sessions
        for o in ("acme", "globex", "initech", None):
            held = sum(1 for e in reference.entries.values() if e[2] == o)
            assert table.count(o) == held
    for key in list(reference.entries):
        assert table.get(key, now_s) == reference.get(key, now_s)
