"""The board's store: a plain Ray actor that engine replicas push their status to.

The ``Board`` deployment's replica starts it (``start_store``) and owns it, so it ends with that
replica (Ray ends an actor whose owner died); every read of the board (the ingress, ``fleet
status``) still goes through the deployment, which reads the store. Engine replicas find it by
name (``find_store``) and push with plain actor calls.

NOTE: not through Ray Serve. Ray Serve sends every handle call as a streaming call, and a replica
reports each call's result to its caller on one thread of its process (Ray's event-loop executor
has one worker: reporting streaming generator output is not thread-safe). An engine replica
frozen with a push in flight (SIGSTOP, a stalled host, a partition) never acknowledged that
report, so the Board's replica answered no one, the ingress's reads included, until Ray killed
the frozen replica: the board's view of every replica stood still for 58 s in one CI run, and
``/admin/fleet`` kept the frozen replica healthy. A plain actor call's result travels in the
reply to the caller's own request, which a frozen caller cannot hold
(``tests/fleet/test_board_store.py``).
"""

from __future__ import annotations

import time
from typing import Any

from loraplex.fleet.board import Board, BoardEntry

STORE_NAME = "loraplex-board"
STORE_NAMESPACE = "loraplex-fleet"  # names are per namespace (Serve runs replicas in "serve")
START_TIMEOUT_S = 60.0  # a new store waits this long for the last one's name to be released


class BoardStore:
    """``Board`` as a Ray actor (``ray.remote`` is applied in ``start_store``)."""

    def __init__(self, stale_after_s: float) -> None:
        self._board = Board(stale_after_s=stale_after_s)

    def put(self, status: dict[str, Any]) -> None:
        self._board.put(status)

    def remove(self, replica_id: str) -> None:
        self._board.remove(replica_id)

    def entries(self) -> list[BoardEntry]:
        return self._board.entries()


def start_store(stale_after_s: float, timeout_s: float = START_TIMEOUT_S) -> Any:
    """A new store owned by the calling process, under ``STORE_NAME``. A store of an earlier
    Board replica that is still alive is used as it is (Serve may start the new replica before
    it stops the old one); one whose owner died is waited for until its name is released."""
    import ray

    deadline = time.monotonic() + timeout_s
    actor = ray.remote(BoardStore).options(
        name=STORE_NAME, namespace=STORE_NAMESPACE, get_if_exists=True, num_cpus=0
    )
    while True:
        store = actor.remote(stale_after_s)
        try:
            ray.get(store.entries.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return store
        except ray.exceptions.RayActorError:  # the last one's, dying with its owner
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def find_store() -> Any:
    """The running store (``ValueError`` while there is none)."""
    import ray

    return ray.get_actor(STORE_NAME, namespace=STORE_NAMESPACE)


def read_store(timeout_s: float) -> list[BoardEntry]:
    """Every replica on the board, read from a process connected to the cluster (``fleet
    status``, ``bench fleet``). NOTE: from the store, not through the ``Board`` deployment: a
    command stopped at its terminal (Ctrl-Z) with a Serve call in flight would hold the
    deployment's replica as a frozen engine replica did (the module's NOTE)."""
    import ray

    entries: list[BoardEntry] = ray.get(find_store().entries.remote(), timeout=timeout_s)
    return entries
