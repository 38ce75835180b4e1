"""Connections a process's transactions take in turn, one kept for tenant requests (PostgreSQL's
pool, SQLite's read connections): the bookkeeping both engines share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from loraplex.errors import RegistryUnavailableError

# Connections (of 2 or more) that only tenant requests (``serving`` transactions:
# authentication, resolution, model cards and listing) may take: administrators' calls waiting
# on the database, or a burst of them, never hold every connection while requests wait for one.
SERVING_RESERVE = 1

C = TypeVar("C")


class Seats(Generic[C]):
    """At most ``size`` connections open or being opened, at most all but ``SERVING_RESERVE``
    of them held by transactions not ``serving`` (NOTE: one connection reserves nothing: it
    serves every call). The owner keeps the open connections; ``cond`` guards both."""

    def __init__(self, size: int, noun: str) -> None:
        self.size = size
        self.noun = noun  # what a message calls them ("connections")
        self.others_max = max(1, size - SERVING_RESERVE)
        self.cond = threading.Condition()
        self.idle: list[C] = []  # the most recently returned last
        self.opening = 0  # connections being opened (counted against the size)
        self.others = 0  # connections held (or being opened) by transactions not ``serving``

    def take(
        self,
        serving: bool,
        wait_s: float,
        open_count: Callable[[], int],
        closed: Callable[[], bool],
        on_take: Callable[[C], object] | None = None,
    ) -> C | None:
        """An idle connection (``on_take`` called on it under ``cond``), else None while there
        is room for a new one (the caller opens it, then calls ``opened`` or ``open_failed``),
        else waits for one returned, at most ``wait_s``; not ``serving``: only while other such
        transactions hold fewer than their share. ``RegistryUnavailableError`` when ``closed``
        or none came in time."""
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                if closed():
                    raise RegistryUnavailableError("it was closed")
                if serving or self.others < self.others_max:
                    if self.idle:
                        taken = self.idle.pop()
                        if on_take is not None:
                            on_take(taken)
                        conn: C | None = taken
                        break
                    if open_count() + self.opening < self.size:
                        conn = None
                        self.opening += 1
                        break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RegistryUnavailableError(self.busy(serving, wait_s))
                self.cond.wait(remaining)
            if not serving:
                self.others += 1
        return conn

    def open_failed(self, serving: bool) -> None:
        """The connection ``take`` left to its caller did not open: its place is free."""
        with self.cond:
            self.opening -= 1
            if not serving:
                self.others -= 1
            self.cond.notify_all()

    def returned(self, serving: bool) -> None:
        """A transaction gave its connection back (under ``cond``)."""
        if not serving:
            self.others -= 1

    def busy(self, serving: bool, wait_s: float) -> str:
        n = self.size
        if not serving and self.others_max < n:
            return (
                f"the {self.others_max} of its {n} {self.noun} that calls other than tenant "
                f"requests may hold stayed busy for {wait_s:g} s"
            )
        held = self.noun.removesuffix("s") if n == 1 else f"{n} {self.noun}"
        return f"its {held} stayed busy for {wait_s:g} s"


@contextmanager
def unnested(local: threading.local) -> Iterator[None]:
    """This thread's one transaction (``local.active`` while it runs): a transaction begun
    inside another is refused."""
    if getattr(local, "active", False):
        raise RuntimeError("registry transactions do not nest")
    local.active = True
    try:
        yield
    finally:
        local.active = False
