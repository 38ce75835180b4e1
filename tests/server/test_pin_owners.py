"""A release's pins and an operator's pins of the same revision never undo each other."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.errors import EngineUnavailableError, RegistryUnavailableError
from loraplex.residency.cache import CacheSummary, CopyHolds, ResidencySnapshot, Unpinned
from loraplex.residency.ledger import Tier
from loraplex.server.pin_owners import OPERATOR, RELEASE, OwnedPins

KEY = AdapterKey("b" * 64, "acme", "support", "r1", "0" * 64)


class RecordingCache:
    """The cache's pin surface: which (revision, tier) are pinned, and every call."""

    def __init__(self) -> None:
        self.pinned: set[tuple[AdapterKey, Tier]] = set()
        self.calls: list[str] = []

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]:
        self.pinned.add((key, tier))
        self.calls.append(f"pin {tier.name}")
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def unpin(self, key: AdapterKey, tier: Tier) -> Unpinned:
        lifted = (key, tier) in self.pinned
        self.pinned.discard((key, tier))
        self.calls.append(f"unpin {tier.name}")
        return Unpinned(lifted)

    def snapshot(self) -> ResidencySnapshot:
        raise NotImplementedError

    def summary(self) -> CacheSummary:
        raise NotImplementedError

    def is_resident(self, key: AdapterKey, tier: Tier) -> bool:
        return (key, tier) in self.pinned

    def prefetch(self, key: AdapterKey, tier: Tier) -> Future[None]:
        raise NotImplementedError

    def evict(self, key: AdapterKey, tier: Tier) -> bool:
        return False

    def holds(self, key: AdapterKey, tier: Tier) -> CopyHolds:
        pinned = (key, tier) in self.pinned
        return CopyHolds(resident=pinned, pinned=pinned)

    def set_warm_policy(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        raise NotImplementedError

    def drop_auto_warm(self, key: AdapterKey) -> None:
        raise NotImplementedError


def test_the_cache_stays_pinned_until_the_last_owner_lets_go() -> None:
    cache = RecordingCache()
    pins = OwnedPins(cache)
    pins.pin(KEY, Tier.L1, RELEASE)
    pins.pin(KEY, Tier.L1)  # an operator, through /admin/residency/pin
    pins.unpin(KEY, Tier.L1, RELEASE)  # the release's window ended
    assert (KEY, Tier.L1) in cache.pinned and pins.owners(KEY, Tier.L1) == {OPERATOR}
    pins.unpin(KEY, Tier.L1)
    assert (KEY, Tier.L1) not in cache.pinned and pins.owners(KEY, Tier.L1) == frozenset()


def test_an_operator_unpin_does_not_lift_a_release_hold_and_tiers_are_separate() -> None:
    cache = RecordingCache()
    pins = OwnedPins(cache)
    pins.pin(KEY, Tier.L1, RELEASE)
    pins.pin(KEY, Tier.L0, OPERATOR)
    pins.unpin(KEY, Tier.L1, OPERATOR)  # the operator never pinned L1: the hold stays
    assert (KEY, Tier.L1) in cache.pinned
    pins.unpin(KEY, Tier.L0, OPERATOR)
    assert cache.pinned == {(KEY, Tier.L1)}


def test_an_unpin_nobody_owns_still_reaches_the_cache() -> None:
    """A pin made before this server tracked owners (or by a warm policy) can still be lifted."""
    cache = RecordingCache()
    cache.pin(KEY, Tier.L1)
    OwnedPins(cache).unpin(KEY, Tier.L1)
    assert cache.pinned == set() and cache.calls[-1] == "unpin L1"


def test_adopted_pins_are_owned_without_pinning_again() -> None:
    # A restarted fleet ingress adopts the pins its replicas hold: the cache has them already.
    cache = RecordingCache()
    pins = OwnedPins(cache)
    pins.adopt({(KEY, Tier.L1): OPERATOR, (KEY, Tier.L0): RELEASE})
    assert cache.calls == []
    assert pins.owners(KEY, Tier.L1) == {OPERATOR} and pins.owners(KEY, Tier.L0) == {RELEASE}
    pins.pin(KEY, Tier.L1, RELEASE)
    pins.unpin(KEY, Tier.L1, RELEASE)  # a release's end leaves the operator's adopted pin
    pins.unpin(KEY, Tier.L0, RELEASE)  # and lifts its own
    assert cache.calls == ["pin L1", "unpin L0"]


def test_an_unpin_answers_who_holds_the_pin_still() -> None:
    """The operator's unpin of a copy a release holds says so (it answered "unpinned" while
    the copy stayed pinned), and one of a pin the operator never made says it lifted nothing."""
    cache = RecordingCache()
    pins = OwnedPins(cache)
    pins.pin(KEY, Tier.L0, RELEASE)
    pins.pin(KEY, Tier.L0)
    assert pins.unpin(KEY, Tier.L0) == Unpinned(True, owners=frozenset({RELEASE}))
    assert pins.unpin(KEY, Tier.L0) == Unpinned(False, owners=frozenset({RELEASE}))
    assert pins.unpin(KEY, Tier.L0, RELEASE) == Unpinned(True)
    assert pins.unpin(KEY, Tier.L0) == Unpinned(False)  # nobody's, and the cache had none
    assert cache.calls == ["pin L0", "pin L0", "unpin L0", "unpin L0"]


class SetRecord:
    """A ``PinRecord`` in a set."""

    def __init__(self) -> None:
        self.pins: set[tuple[AdapterKey, Tier]] = set()

    def record(self, key: AdapterKey, tier: Tier) -> bool:
        new = (key, tier) not in self.pins
        self.pins.add((key, tier))
        return new

    def remove(self, key: AdapterKey, tier: Tier) -> bool:
        found = (key, tier) in self.pins
        self.pins.discard((key, tier))
        return found


class RefusingCache(RecordingCache):
    """A cache whose engine is down: every pin and unpin raises."""

    def pin(self, key: AdapterKey, tier: Tier) -> Future[None]:
        raise EngineUnavailableError("the engine process is down")

    def unpin(self, key: AdapterKey, tier: Tier) -> Unpinned:
        raise EngineUnavailableError("the engine process is down")


def test_only_an_operators_pins_are_recorded_and_an_unpin_removes_them() -> None:
    record = SetRecord()
    pins = OwnedPins(RecordingCache(), record)
    pins.pin(KEY, Tier.L1, RELEASE)  # releases persist their own state
    assert record.pins == set()
    pins.pin(KEY, Tier.L1)
    pins.pin(KEY, Tier.L0)
    assert record.pins == {(KEY, Tier.L1), (KEY, Tier.L0)}
    pins.unpin(KEY, Tier.L1, RELEASE)
    pins.unpin(KEY, Tier.L1)
    assert record.pins == {(KEY, Tier.L0)}


def test_a_pin_or_unpin_the_cache_refuses_leaves_the_record_as_it_was() -> None:
    record = SetRecord()
    record.pins.add((KEY, Tier.L0))  # recorded (and pinned) before the engine went down
    pins = OwnedPins(RefusingCache(), record)
    pins.adopt({(KEY, Tier.L0): OPERATOR})
    with pytest.raises(EngineUnavailableError):
        pins.pin(KEY, Tier.L1)
    with pytest.raises(EngineUnavailableError):
        pins.unpin(KEY, Tier.L0)
    assert record.pins == {(KEY, Tier.L0)}


class RefusingOnce(RecordingCache):
    """A cache whose next unpin is refused (the engine blinked), then works again."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True

    def unpin(self, key: AdapterKey, tier: Tier) -> Unpinned:
        if self.refuse:
            self.refuse = False
            raise EngineUnavailableError("the engine process is down")
        return super().unpin(key, tier)


def test_an_unpin_the_cache_refuses_leaves_the_owner_and_a_second_unpin_lifts_it() -> None:
    """Memory and the record agree after a refusal: the record is put back, and so is the
    owner, so the operator's next unpin finds its pin (it found no owner, leaving the cache
    pinned behind an answer of "nothing lifted")."""
    cache = RefusingOnce()
    record = SetRecord()
    pins = OwnedPins(cache, record)
    pins.pin(KEY, Tier.L0)
    with pytest.raises(EngineUnavailableError):
        pins.unpin(KEY, Tier.L0)
    assert record.pins == {(KEY, Tier.L0)} and (KEY, Tier.L0) in cache.pinned
    assert pins.owners(KEY, Tier.L0) == {OPERATOR}
    assert pins.holds(KEY, Tier.L0).owners == {OPERATOR}
    assert pins.unpin(KEY, Tier.L0) == Unpinned(True)
    assert cache.pinned == set() and record.pins == set()
    assert pins.owners(KEY, Tier.L0) == frozenset()


def test_a_failed_record_pins_nothing() -> None:
    class DownRecord(SetRecord):
        def record(self, key: AdapterKey, tier: Tier) -> bool:
            raise RegistryUnavailableError("the registry's connection stayed busy")

    cache = RecordingCache()
    with pytest.raises(RegistryUnavailableError):
        OwnedPins(cache, DownRecord()).pin(KEY, Tier.L1)
    assert cache.calls == []


OTHER = AdapterKey("c" * 64, "globex", "search", "r1", "1" * 64)


class SlowRecord(SetRecord):
    """A registry whose write of ``KEY``'s pin has landed but whose commit waits for
    ``commit`` (a PostgreSQL under load); ``writing`` is set once the write is under way."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.commit = threading.Event()

    def record(self, key: AdapterKey, tier: Tier) -> bool:
        new = super().record(key, tier)
        if key == KEY:
            self.writing.set()
            assert self.commit.wait(timeout=60)
        return new


def _start(call: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_a_slow_record_write_stalls_no_other_pin() -> None:
    """Every pin, unpin and ``holds`` waited for one operator pin's registry write (one lock
    across it); only calls on the same (revision, tier) must wait."""
    cache, record = RecordingCache(), SlowRecord()
    pins = OwnedPins(cache, record)
    slow = _start(lambda: pins.pin(KEY, Tier.L1))
    assert record.writing.wait(timeout=60)
    try:

        def others() -> None:
            pins.pin(OTHER, Tier.L1)  # another operator pin, recorded too
            pins.pin(KEY, Tier.L0, RELEASE)  # the same revision in another tier
            pins.unpin(OTHER, Tier.L1)
            assert pins.holds(KEY, Tier.L1) == CopyHolds(resident=False, pinned=False)

        rest = _start(others)
        rest.join(timeout=60)  # a deadlock guard, not a timing: it waits for the commit
        assert not rest.is_alive(), "a pin of another copy waited for KEY's record write"
        assert cache.calls == ["pin L1", "pin L0", "unpin L1"]  # OTHER's, KEY's L0, OTHER's
    finally:
        record.commit.set()
        slow.join(timeout=60)
    assert cache.pinned == {(KEY, Tier.L1), (KEY, Tier.L0)} and record.pins == {(KEY, Tier.L1)}


def test_an_unpin_of_the_same_copy_waits_for_the_pins_record_and_cache_call() -> None:
    """The record and the cache agree after a pin and an unpin of one copy race: the unpin
    waits for the pin's record write and cache pin. Run between them, it removed the record,
    found no owner and unpinned nothing, and the pin then left the copy pinned, unrecorded (so
    lost at the next restart) and owned by an operator whose record said otherwise."""
    cache, record = RecordingCache(), SlowRecord()
    pins = OwnedPins(cache, record)
    pinning = _start(lambda: pins.pin(KEY, Tier.L1))
    assert record.writing.wait(timeout=60)
    unpinned: list[Unpinned] = []
    unpinning = _start(lambda: unpinned.append(pins.unpin(KEY, Tier.L1)))
    unpinning.join(timeout=1)  # unordered, it would be done by now; ordered, it waits
    assert unpinned == []
    record.commit.set()
    pinning.join(timeout=60)
    unpinning.join(timeout=60)
    assert unpinned == [Unpinned(True)]
    assert cache.pinned == set() and record.pins == set() and not pins.owners(KEY, Tier.L1)
    assert cache.calls == ["pin L1", "unpin L1"]
    assert pins._pin_locks == {}  # per-copy locks live only while a call holds or awaits them
