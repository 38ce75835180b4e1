"""The engine child's outbox: the engine loop queues what it sends and goes on, a thread of its
own writes it to the pipe in order; a parent that stops reading still stalls the sender once the
queue is full; a broken pipe never blocks a sender; ``close`` sends what is queued first."""

from __future__ import annotations

import threading
from collections.abc import Callable
from multiprocessing import Pipe

from loraplex.engine.transport.child_outbox import ChildOutbox

_BIG = b"x" * (256 * 1024)  # far above a pipe's buffer: the writer blocks until it is read
_WAIT_S = 30.0  # generous bound for what must finish; what must block is given 0.5 s


def _in_thread(work: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_sends_return_while_the_parent_is_not_reading_then_arrive_in_order() -> None:
    parent, child = Pipe(duplex=True)
    outbox = ChildOutbox(child)
    try:
        # NOTE: a direct ``child.send`` of these would block on the first (nobody reads yet).
        sender = _in_thread(lambda: [outbox.send((i, _BIG)) for i in range(8)])
        sender.join(_WAIT_S)
        assert not sender.is_alive()
        received = [parent.recv() for _ in range(8)]
        assert [i for i, _ in received] == list(range(8))
        assert all(payload == _BIG for _, payload in received)
    finally:
        outbox.close(_WAIT_S)
        parent.close()
        child.close()


def test_a_full_queue_stalls_the_sender_until_the_parent_reads() -> None:
    parent, child = Pipe(duplex=True)
    outbox = ChildOutbox(child, max_queued=2)
    try:
        sender = _in_thread(lambda: [outbox.send((i, _BIG)) for i in range(6)])
        sender.join(0.5)
        assert sender.is_alive()  # the writer is stuck on the pipe and the queue is full
        received = [parent.recv()[0] for _ in range(6)]
        sender.join(_WAIT_S)
        assert not sender.is_alive()
        assert received == list(range(6))
    finally:
        outbox.close(_WAIT_S)
        parent.close()
        child.close()


def test_close_sends_what_is_queued_then_refuses_more() -> None:
    parent, child = Pipe(duplex=True)
    outbox = ChildOutbox(child)
    for i in range(5):
        outbox.send(i)
    outbox.close(_WAIT_S)
    assert [parent.recv() for _ in range(5)] == list(range(5))
    assert not parent.poll(0.1)  # nothing else: the close marker is not sent
    try:
        outbox.send(5)
    except ValueError:
        pass
    else:
        raise AssertionError("send after close must raise ValueError")
    parent.close()
    child.close()


def test_a_broken_pipe_never_blocks_a_sender() -> None:
    parent, child = Pipe(duplex=True)
    outbox = ChildOutbox(child, max_queued=2)
    parent.close()  # the parent is gone
    sender = _in_thread(lambda: [outbox.send((i, _BIG)) for i in range(20)])
    sender.join(_WAIT_S)
    assert not sender.is_alive()  # far more than max_queued went: the writer drops them
    outbox.close(_WAIT_S)
    assert isinstance(outbox.broken, OSError)
    child.close()
