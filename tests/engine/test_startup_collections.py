"""The engine child's start-up runs no garbage collection until it is built, then one that frees
what start-up left in cycles, freezes what survives and turns collection back on."""

from __future__ import annotations

import gc
import weakref

from loraplex.engine.transport.process_child import startup_collections


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it


def test_no_collection_inside_then_one_that_frees_cycles_and_freezes_the_rest() -> None:
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    kept = [_Node() for _ in range(100)]
    try:
        with startup_collections():
            assert not gc.isenabled()
            garbage = weakref.ref(_Node())
            churn = [[] for _ in range(10 * gc.get_threshold()[0])]  # would set one off
            assert garbage() is not None  # none ran
            del churn
        assert gc.isenabled()
        assert garbage() is None  # the one collection freed the cycle
        assert gc.get_freeze_count() >= frozen_before + len(kept)  # the survivors are frozen
    finally:
        gc.unfreeze()  # give the test process its generations back
