"""Releases in the registry database (SQLite and PostgreSQL): start checks, one active release
per alias, compare-and-set transitions, atomicity, the alias history and the sticky canary."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from registry_kit import AdapterFactory

from loraplex.errors import AdapterNotFoundError, RegistryError
from loraplex.registry import AliasTarget, RegistrationRequest, Registry, RevisionState, releases
from loraplex.registry.resolution import sticky_unit
from loraplex.registry.sql import audit
from loraplex.registry.sql.db import Row, Tx
from loraplex.registry.sql.releases import CANARY_STATE
from loraplex.release.errors import (
    InvalidTransitionError,
    ReleaseConflictError,
    ReleaseStartError,
)
from loraplex.release.model import Release, ReleasePlan, ReleaseState
from loraplex.release.store import ReleaseStore

S = ReleaseState


@pytest.fixture
def bot(registry: Registry, make_adapter: AdapterFactory) -> Registry:
    """acme/bot with v1 (the alias), v2, v3."""
    registry.create_tenant("acme", "ops")
    for seed, revision in enumerate(("v1", "v2", "v3")):
        request = RegistrationRequest(make_adapter(revision, seed=seed), "acme", "bot", revision)
        registry.register(request, "ops")
    return registry


def _canary(store: ReleaseStore, registry: Registry, revision: str = "v2") -> Release:
    release = store.start_release(
        "acme", "bot", revision, ReleasePlan(ladder=(0.25, 0.5)), actor="ops"
    )
    for to in (S.PREWARMING, S.PROBING):
        release = store.transition(release, to, actor="c", now=registry.now())
    return store.transition(release, S.CANARY, actor="c", now=registry.now(), step=0)


def test_start_checks_the_revision_and_the_alias(bot: Registry) -> None:
    store = ReleaseStore(bot)
    with pytest.raises(AdapterNotFoundError, match="acme/bot@v9"):
        store.start_release("acme", "bot", "v9", ReleasePlan(), actor="ops")
    with pytest.raises(ReleaseStartError, match="already routes to v1"):
        store.start_release("acme", "bot", "v1", ReleasePlan(), actor="ops")
    bot.set_release("acme/bot@v3", "ops", state=RevisionState.DEPRECATED)
    with pytest.raises(ReleaseStartError, match="deprecated"):
        store.start_release("acme", "bot", "v3", ReleasePlan(), actor="ops")

    first = store.start_release("acme", "bot", "v2", ReleasePlan(), actor="ops")
    assert (first.baseline, first.state, first.version) == ("v1", S.STAGED, 0)
    bot.set_release("acme/bot@v3", "ops", state=RevisionState.STABLE)
    with pytest.raises(ReleaseStartError, match=f"already has release {first.release_id}"):
        store.start_release("acme", "bot", "v3", ReleasePlan(), actor="ops")
    with pytest.raises(RegistryError, match="being released"):
        bot.set_alias("acme", "bot", (AliasTarget("v3", 1),), "ops")


def test_the_database_allows_one_active_release_per_alias(bot: Registry) -> None:
    store = ReleaseStore(bot)
    first = store.start_release("acme", "bot", "v2", ReleasePlan(), actor="ops")
    with pytest.raises(Exception) as info, bot.db.transaction() as tx:
        tx.execute(
            "INSERT INTO releases (release_id, tenant, name, candidate, baseline, state, active, "
            "step, plan, created_at, updated_at, actor, version) "
            "VALUES ('rel-x', 'acme', 'bot', 'v3', 'v1', 'staged', 1, 0, '{}', 0, 0, 'x', 0)"
        )
    assert bot.db.is_unique_violation(info.value)
    assert [r.release_id for r in store.list_releases()] == [first.release_id]


def test_a_stale_transition_loses_and_changes_nothing(bot: Registry) -> None:
    store = ReleaseStore(bot)
    staged = store.start_release("acme", "bot", "v2", ReleasePlan(), actor="ops")
    store.transition(staged, S.PREWARMING, actor="a", now=1.0)
    entries = len(bot.audit_log())
    with pytest.raises(ReleaseConflictError, match="version 1"):
        store.transition(staged, S.ABORTED, actor="b", now=2.0)
    with pytest.raises(InvalidTransitionError, match="cannot move to promoted"):
        store.transition(store.get_release(staged.release_id), S.PROMOTED, actor="b", now=2.0)
    assert store.get_release(staged.release_id).state is S.PREWARMING
    assert len(bot.audit_log()) == entries


def test_a_transition_failing_midway_leaves_the_state_before(
    bot: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ReleaseStore(bot)
    canary = _canary(store, bot)

    real_append = audit.append

    def crash_at_the_last_statement(tx: object, action: str, *args: object, **kw: object) -> None:
        if action.startswith("release."):
            raise OSError("killed between statements")
        real_append(tx, action, *args, **kw)  # type: ignore[arg-type]

    # The alias change, the revision state and the release row are written; then the crash.
    monkeypatch.setattr(audit, "append", crash_at_the_last_statement)
    with pytest.raises(OSError, match="killed"):
        store.promote("acme", "bot", actor="ops")
    monkeypatch.undo()

    assert store.get_release(canary.release_id) == canary
    assert bot.get_alias("acme", "bot").targets == (AliasTarget("v1", 1),)
    assert bot.alias_history("acme", "bot") == []
    assert bot.get_revision("acme/bot@v2").state is RevisionState.STABLE


def test_promotion_then_rollback_walks_the_alias_history(bot: Registry) -> None:
    store = ReleaseStore(bot)
    _canary(store, bot)
    promoted = store.promote("acme", "bot", actor="ops")
    assert bot.get_alias("acme", "bot").targets == (AliasTarget("v2", 1),)
    assert [t for t, _ in bot.alias_history("acme", "bot")] == [(AliasTarget("v1", 1),)]

    rolled = store.rollback("acme", "bot", actor="ops")
    assert (rolled.state, rolled.hold_until) == (S.ROLLED_BACK, promoted.hold_until)
    assert bot.get_alias("acme", "bot").targets == (AliasTarget("v1", 1),)
    # the rollback popped the history: the refusal no longer sends the operator to an
    # `adapters alias rollback` that would fail with "no rollback target"
    with pytest.raises(InvalidTransitionError, match="cannot rollback") as refused:
        store.rollback("acme", "bot", actor="ops")
    assert "keeps no earlier targets" in str(refused.value)
    assert "alias rollback" not in str(refused.value)
    bot.set_alias("acme", "bot", (AliasTarget("v2", 1),), "ops")
    with pytest.raises(InvalidTransitionError, match="cannot rollback") as refused:
        store.rollback("acme", "bot", actor="ops")
    assert "`loraplex adapters alias rollback acme/bot` moves it further back" in str(refused.value)


def test_rollback_twice_goes_back_twice(bot: Registry) -> None:
    bot.set_alias("acme", "bot", (AliasTarget("v2", 1),), "ops")
    bot.set_alias("acme", "bot", (AliasTarget("v3", 3), AliasTarget("v2", 1)), "ops")
    assert bot.get_alias("acme", "bot").rollback_targets == (AliasTarget("v2", 1),)

    first = bot.rollback_alias("acme", "bot", "ops")
    assert first.targets == (AliasTarget("v2", 1),)
    assert first.rollback_targets == (AliasTarget("v1", 1),)
    second = bot.rollback_alias("acme", "bot", "ops")
    assert second.targets == (AliasTarget("v1", 1),)
    assert second.rollback_targets == ()
    with pytest.raises(RegistryError, match="no rollback target"):
        bot.rollback_alias("acme", "bot", "ops")


class _RowCounter:
    """A transaction that counts the rows its queries return."""

    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self.rows = 0

    def execute(self, sql: str, params: Sequence[object] = ()) -> None:
        self._tx.execute(sql, params)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        found = self._tx.query(sql, params)
        self.rows += len(found)
        return found

    def query_one(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        found = self._tx.query_one(sql, params)
        self.rows += found is not None
        return found


def test_a_rollback_reads_a_bounded_number_of_rows_however_long_the_history(
    bot: Registry,
) -> None:
    """A rollback reads the history's top, not the whole history (its cost grew with every
    alias flip: a tenant flipping thousands of times slowed each of its rollbacks)."""
    for _ in range(20):
        for revision in ("v2", "v1"):
            bot.set_alias("acme", "bot", (AliasTarget(revision, 1),), "ops")
    with bot.db.transaction() as tx:
        counted = _RowCounter(tx)
        alias = releases.rollback_alias_in(counted, "acme", "bot", actor="ops", now=bot.now())
    assert alias.targets == (AliasTarget("v2", 1),)
    assert alias.rollback_targets == (AliasTarget("v1", 1),)
    assert len(bot.alias_history("acme", "bot")) == 39
    assert counted.rows <= 5  # adapter, alias, target revision, popped entry, new top


def test_the_canary_state_literal_matches_the_release_model() -> None:
    assert ReleaseState.CANARY.value == CANARY_STATE


def test_canary_share_is_sticky_bounded_and_only_grows(bot: Registry) -> None:
    store = ReleaseStore(bot)
    canary = _canary(store, bot)
    callers = [f"user-{i}" for i in range(400)]

    def on_candidate() -> set[str]:
        return {
            c for c in callers if bot.resolve_revision("acme", "bot", sticky_key=c).revision == "v2"
        }

    at_25 = on_candidate()
    assert at_25 == on_candidate()  # the same caller, the same side, every time
    assert 0.18 * 400 <= len(at_25) <= 0.32 * 400
    assert bot.resolve_revision("acme", "bot", sticky_key="x").revision in {"v1", "v2"}
    assert bot.resolve("acme", "bot@v3").revision == "v3"  # pins are untouched

    store.transition(canary, S.CANARY, actor="c", now=bot.now(), step=1)
    at_50 = on_candidate()
    assert at_25 < at_50  # raising the share only adds callers
    assert 0.42 * 400 <= len(at_50) <= 0.58 * 400

    store.rollback("acme", "bot", actor="ops")
    assert on_candidate() == set()


def test_a_canary_on_a_weighted_alias_draws_as_one_weighted_alias(bot: Registry) -> None:
    """One draw per caller decides both: below the canary's share (1/4) the candidate, above it
    the alias's weights (3:1) spread over the rest; so the callers split exactly as an alias
    weighting the candidate 1/4, then v1 and v3 3/4 in 3:1, would split them."""
    bot.set_alias("acme", "bot", (AliasTarget("v1", 3), AliasTarget("v3", 1)), "ops")
    callers = [f"user:{i}" for i in range(400)]

    def sides() -> list[str]:
        return [bot.resolve_revision("acme", "bot", sticky_key=c).revision for c in callers]

    store = ReleaseStore(bot)
    _canary(store, bot)
    in_canary = sides()
    store.rollback("acme", "bot", actor="ops")
    as_weights = (AliasTarget("v2", 4), AliasTarget("v1", 9), AliasTarget("v3", 3))
    bot.set_alias("acme", "bot", as_weights, "ops")
    assert in_canary == sides()
    counts = {r: in_canary.count(r) for r in ("v1", "v2", "v3")}
    assert 70 <= counts["v2"] <= 130 and 2 * counts["v3"] < counts["v1"] < 4 * counts["v3"]


def test_before_canary_the_candidate_gets_no_unpinned_traffic(bot: Registry) -> None:
    store = ReleaseStore(bot)
    release = store.start_release("acme", "bot", "v2", ReleasePlan(ladder=(1.0,)), actor="ops")
    for to in (S.PREWARMING, S.PROBING):
        served = {
            bot.resolve_revision("acme", "bot", sticky_key=str(i)).revision for i in range(50)
        }
        assert served == {"v1"}
        release = store.transition(release, to, actor="c", now=bot.now())
    assert bot.resolve("acme", "bot@v2").revision == "v2"


@settings(max_examples=200, deadline=None)
@given(
    release_id=st.text(min_size=1, max_size=20),
    key=st.text(max_size=40),
    low=st.floats(0.0, 1.0),
    high=st.floats(0.0, 1.0),
)
def test_sticky_unit_is_fixed_and_monotone_in_the_share(
    release_id: str, key: str, low: float, high: float
) -> None:
    unit = sticky_unit(release_id, key)
    assert unit == sticky_unit(release_id, key)
    assert 0.0 <= unit < 1.0
    low, high = min(low, high), max(low, high)
    assert not (unit < low) or unit < high  # on the candidate at a share: on it at any larger


def test_migration_2_turns_the_rollback_target_into_the_first_history_entry(
    database_url: str,
) -> None:
    from loraplex.registry.sql.connect import open_database
    from loraplex.registry.sql.migrations import MIGRATIONS, migrate

    db = open_database(database_url)
    try:
        migrate(db, now=1.0, migrations=MIGRATIONS[:1])
        with db.transaction() as tx:
            tx.execute("INSERT INTO tenants (name, priority, created_at) VALUES ('t', 'normal', 0)")
            tx.execute("INSERT INTO adapters VALUES ('t', 'a', 'private', 0)")
            tx.execute("INSERT INTO adapters VALUES ('t', 'b', 'private', 0)")
            tx.execute(
                "INSERT INTO aliases VALUES ('t', 'a', '[{\"revision\": \"v2\", \"weight\": 1}]', "
                '\'[{"revision": "v1", "weight": 1}]\', 5.0)'
            )
            tx.execute(
                "INSERT INTO aliases VALUES ('t', 'b', "
                '\'[{"revision": "v1", "weight": 1}]\', \'[]\', 6.0)'
            )
        assert migrate(db, now=2.0, migrations=MIGRATIONS[:2]) == 2
        with db.transaction(write=False) as tx:
            rows = tx.query("SELECT tenant, name, seq, targets, pushed_at FROM alias_history")
        assert [tuple(r) for r in rows] == [("t", "a", 1, '[{"revision": "v1", "weight": 1}]', 5.0)]
    finally:
        db.close()
