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


def test_a_watch_that_ends_in_time_leaves_the_socket_alone() -> None:
    watchdog = Watchdog(limit_s=0.2)
    ours, server = socket.socketpair()
    with ours, server:
        for _ in range(3):
            with watchdog.watching(ours.fileno()) as watch:
                server.sendall(b"x")
                assert ours.recv(1) == b"x"
            assert not watch.fired
        time.sleep(0.4)  # past every deadline above: the ended watches fire nothing
        server.sendall(b"y")
        assert ours.recv(1) == b"y"
    watchdog.stop()
