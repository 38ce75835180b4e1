"""The server process's copy of its engine child's published state: residency merged from
deltas (a full answer replaces it, ``()`` removes a key), the adapters in GPU slots kept apart
for ``load_snapshot``, and the queue view and cache summary kept until they change."""

from __future__ import annotations

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.sched.stats import QueueView
from loraplex.engine.transport.messages import StatePublish
from loraplex.engine.transport.process_state import PublishedState
from loraplex.residency.cache import ResidencyChanges
from loraplex.residency.ledger import Tier

L0, L1, L2 = Tier.L0, Tier.L1, Tier.L2


def _key(name: str) -> AdapterKey:
    return AdapterKey("b" * 64, "acme", name, "r1", name[0] * 64)


A, B, C = _key("a"), _key("b"), _key("c")


def _residency(version: int, tiers: dict[AdapterKey, tuple[Tier, ...]], full: bool) -> StatePublish:
    return StatePublish(None, ResidencyChanges(version, tiers, full), None)


def test_deltas_merge_and_an_empty_tier_tuple_removes_the_key() -> None:
    state = PublishedState()
    state.apply(_residency(3, {A: (L0, L1), B: (L2,)}, full=True))
    state.apply(_residency(5, {A: (L1,), C: (L0,), B: ()}, full=False))
    assert not state.is_resident(A, L0) and state.is_resident(A, L1)
    assert not state.is_resident(B, L2)
    assert state.is_resident(C, L0)
    assert state.load(4).running_adapters == (C,)


def test_a_full_answer_replaces_the_map() -> None:
    state = PublishedState()
    state.apply(_residency(1, {A: (L0,), B: (L1,)}, full=True))
    state.apply(_residency(9, {C: (L0,)}, full=True))
    assert not state.is_resident(A, L0) and not state.is_resident(B, L1)
    assert state.load(4).running_adapters == (C,)


def test_load_combines_the_last_queue_view_with_the_slots() -> None:
    state = PublishedState()
    view = QueueView(2, 2, 1, 0.5, (A, B), 40, lora_running=(C,), lora_waiting=(A, C))
    state.apply(StatePublish(view, None, None))
    state.apply(_residency(1, {A: (L0,)}, full=True))  # a residency-only publish keeps the view
    load = state.load(max_loras=4)
    assert (load.num_waiting, load.num_adapter_wait, load.num_running) == (2, 2, 1)
    assert load.kv_usage == 0.5
    assert load.running_adapters == (A,)
    assert load.waiting_adapters == (B,)  # A is already in a slot: never listed twice
    assert (load.lora_running, load.lora_waiting) == ((C,), (A, C))  # the view's, as published
    assert load.max_loras == 4
    assert state.num_updates == 2


def test_clear_forgets_everything_the_dead_child_published() -> None:
    state = PublishedState()
    state.apply(StatePublish(QueueView(1, 0, 1, 0.1, (), 7), None, None))
    state.apply(_residency(1, {A: (L0,)}, full=True))
    state.clear()
    assert not state.is_resident(A, L0)
    assert state.summary() is None
    load = state.load(4)
    assert (load.num_waiting, load.num_running, load.running_adapters) == (0, 0, ())
