"""The board's store against an engine replica frozen with pushes in flight (``board_store``'s
NOTE): the store keeps answering everyone else, the frozen replica's entry goes stale and the
others' stay fresh. Through Ray Serve (the board before) such a caller held the board's one
reporting thread until Ray killed it, and every read waited."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import pytest

from loraplex.fleet.board_store import BoardStore, find_store, start_store

STALE_AFTER_S = 1.0
READ_TIMEOUT_S = 10.0  # far above a read's cost: a read that waits on the frozen caller never ends


def _status(replica_id: str) -> dict[str, Any]:
    return {"replica_id": replica_id, "healthy": True}


def test_a_replica_frozen_with_pushes_in_flight_holds_no_one(ray_cluster: None) -> None:
    import ray
    from ray import cloudpickle

    # the pushers' class travels by value: Ray's workers cannot import this test module
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    class Pusher:
        def pid(self) -> int:
            return os.getpid()

        def push(self, replica_id: str) -> None:
            ray.get(find_store().put.remote(_status(replica_id)))

        def push_then_freeze(self, replica_id: str, count: int) -> None:
            store = find_store()
            ray.get(store.put.remote(_status(replica_id)))
            for _ in range(count):  # not waited for: their replies come to a frozen caller
                store.put.remote(_status(replica_id))
            time.sleep(0.05)  # on their way (Ray sends them from its own thread)
            os.kill(os.getpid(), signal.SIGSTOP)

    store = start_store(STALE_AFTER_S)
    pushers = [ray.remote(num_cpus=0)(Pusher).remote() for _ in range(2)]
    frozen_pid = ray.get(pushers[0].pid.remote())
    try:
        pushers[0].push_then_freeze.remote("frozen", 64)
        deadline = time.monotonic() + 60
        seen_frozen = False
        while not seen_frozen:  # its pushes landed; it is stopped by now or soon
            assert time.monotonic() < deadline, "the frozen replica's pushes never landed"
            ray.get(pushers[1].push.remote("live"), timeout=READ_TIMEOUT_S)
            entries = ray.get(store.entries.remote(), timeout=READ_TIMEOUT_S)
            seen_frozen = any(e.replica_id == "frozen" for e in entries)
        while True:  # the board goes on answering: the frozen entry ages out of freshness
            assert time.monotonic() < deadline, "the frozen replica never went stale"
            ray.get(pushers[1].push.remote("live"), timeout=READ_TIMEOUT_S)
            entries = {
                e.replica_id: e for e in ray.get(store.entries.remote(), timeout=READ_TIMEOUT_S)
            }
            if not entries["frozen"].fresh:
                break
            time.sleep(0.1)
        assert entries["live"].fresh and entries["live"].healthy
        assert entries["frozen"].down_reason.startswith("stale report")
    finally:
        os.kill(frozen_pid, signal.SIGKILL)
        for actor in (*pushers, store):
            ray.kill(actor)


def test_a_second_start_uses_the_running_store(ray_cluster: None) -> None:
    """A new Board replica started while the old one runs (Serve replaces it) shares its store:
    the name is taken, and a second actor under it would be refused."""
    import ray

    first = start_store(STALE_AFTER_S)
    try:
        ray.get(first.put.remote(_status("r1")))
        second = start_store(STALE_AFTER_S)
        assert [e.replica_id for e in ray.get(second.entries.remote())] == ["r1"]
    finally:
        ray.kill(first)


def test_the_store_is_the_board() -> None:
    """Without Ray: put, entries and remove reach one ``Board``."""
    store = BoardStore(STALE_AFTER_S)
    store.put(_status("r1"))
    assert [e.replica_id for e in store.entries()] == ["r1"]
    store.remove("r1")
    assert store.entries() == []
    with pytest.raises(ValueError, match="replica_id"):
        store.put({"healthy": True})
