"""``Watchdog``: a statement past its deadline has its socket shut down (the waiting thread
wakes with an error), one that ended in time is left alone."""

from __future__ import annotations

import socket
import time

from loraplex.registry.sql.watchdog import Watchdog


def test_a_wait_past_the_deadline_is_woken_by_a_shut_down_socket() -> None:
    watchdog = Watchdog(limit_s=0.2)
    ours, server = socket.socketpair()
    with ours, server:
        with watchdog.watching(ours.fileno()) as watch:
            assert ours.recv(1) == b""  # blocks: the "server" never writes; woken by shutdown
        assert watch.fired
    watchdog.stop()


class _Clock:
    """A clock the test moves: a watch's time passes only when the test says so, however long a
    loaded machine takes over the lines inside the watch (with the real clock and a 0.2 s
    limit, a watch that ended "in time" could pass its deadline). The watchdog's thread still
    waits in real seconds: ``limit_s`` at most, then it reads this clock again."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_a_watch_that_ends_in_time_leaves_the_socket_alone() -> None:
    clock = _Clock()
    watchdog = Watchdog(limit_s=0.2, clock=clock)
    ours, server = socket.socketpair()
    with ours, server:
        for _ in range(3):
            with watchdog.watching(ours.fileno()) as watch:
                server.sendall(b"x")
                assert ours.recv(1) == b"x"
            assert not watch.fired
        clock.now_s += 1.0  # past every deadline above
        time.sleep(0.4)  # the thread has read the clock again: the ended watches fire nothing
        server.sendall(b"y")
        assert ours.recv(1) == b"y"
    watchdog.stop()


def test_watches_at_once_each_fire_alone() -> None:
    clock = _Clock()
    watchdog = Watchdog(limit_s=0.2, clock=clock)
    stuck, stuck_server = socket.socketpair()
    fine, fine_server = socket.socketpair()
    with stuck, stuck_server, fine, fine_server:
        with watchdog.watching(stuck.fileno()) as stuck_watch:
            with watchdog.watching(fine.fileno()) as fine_watch:
                fine_server.sendall(b"x")
                assert fine.recv(1) == b"x"
            clock.now_s += 1.0  # past both deadlines: one watch ended in time, one goes on
            assert stuck.recv(1) == b""  # blocks until the watchdog shuts it down
        assert stuck_watch.fired and not fine_watch.fired
        clock.now_s += 1.0
        time.sleep(0.4)  # the thread has read the clock again: the ended watch fires nothing
        fine_server.sendall(b"y")
        assert fine.recv(1) == b"y"
    watchdog.stop()
