"""An attack run in its own OS process (multiprocessing "spawn"), not in the victims' client.

Before this, the attacker shared the victims' client's process and event loop, so its own
client-side work (reopening 1,100 sockets, encoding 4 MB bodies) delayed the victims' measured
TTFT: an artifact, since a real attacker is another machine. Now the victims' client stays in
the benchmark's process and the attack runs in a child of it, started before the victims'
trace and stopped after it. Both still share this machine's cores with the server; what the
child's CPU costs them is reported as ``attacker_cpu_s``.

``priority`` says how the child competes for those cores. ``"normal"`` (the default, as the
server and the victims' client) charges the server with the attacker's own client-side work.
``"idle"`` (Linux ``SCHED_IDLE``) runs the child only on cycles nobody else wants, as if its
client work ran on another machine; its traffic still reaches the server (``bench serve``
reports what each attack achieved: sockets opened and held, requests sent). NOTE: measured, it
is not neutral: with an idle attacker sending 4 MB bodies (``token-id-batch``) the victims' P99
TTFT was 2.0-2.3x calm against 1.03x with a normal one (two runs of two rounds each,
docs/benchmarks/serve.md). One explanation, not verified here: a starved sender holding a
socket's kernel lock that the server then waits on, an inversion a remote attacker would not
cause. So the default stays ``"normal"``.

The handshake keeps the timings of the in-process attack: the child imports the attack's
modules and reports ready before the parent starts its clocks, then starts attacking when told
to (``go``), together with the victims' trace; the parent sets ``stop`` when the trace is over
and receives the attack's tally (exactly what the attack returned) and the child's CPU seconds.
The same holds for the mixed attacker of ``serve_attacker``, which runs its schedule to its end
whatever ``stop`` says.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as MpEvent
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# The attack, called in the child with the event ``stop`` sets: a module-level coroutine
# function or a ``functools.partial`` of one (it is pickled into the child).
AttackCall = Callable[[asyncio.Event], Coroutine[Any, Any, T]]

READY_TIMEOUT_S = 120.0  # the child's imports and start (a loaded machine: tens of seconds)
STOP_TIMEOUT_S = 120.0  # after ``stop``: an attack ends its exchanges (hung-engine its stop)
_CONTEXT = mp.get_context("spawn")  # never fork: the parent holds threads and an event loop
PRIORITIES = ("normal", "idle")  # how the attack's process competes for the cores (above)


class AttackProcessError(RuntimeError):
    """The attack's process failed, or did not answer in time: the run has no valid tally."""


@dataclass(frozen=True)
class AttackResult(Generic[T]):
    """What the attack's process returns to the benchmark."""

    tally: T  # what the attack returned, unchanged
    cpu_s: float  # the process's CPU seconds (user + system) from ``go`` to its end


def _child(call: AttackCall[T], events: _Events, priority: str) -> None:
    """The child's entry: ready, wait for ``go``, attack until ``stop``, send the result."""
    if priority == "idle":  # before any thread starts: Linux schedules each thread on its own
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    events.conn.send("ready")
    events.go.wait()
    began = time.process_time()
    try:
        tally = asyncio.run(_attack_until_stopped(call, events.stop))
    except BaseException as exc:
        events.conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    events.conn.send(("tally", AttackResult(tally, round(time.process_time() - began, 2))))


async def _attack_until_stopped(call: AttackCall[T], stop: MpEvent) -> T:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    # NOTE: a daemon-less executor thread waits on the process-wide event; it returns once set.
    watcher = loop.run_in_executor(None, stop.wait)
    watcher.add_done_callback(lambda _: stopped.set())
    return await call(stopped)


@dataclass(frozen=True)
class _Events:
    """The child's side of the handshake."""

    conn: Connection  # child -> parent: "ready", then ("tally", result) or ("error", why)
    go: MpEvent  # parent -> child: start attacking
    stop: MpEvent  # parent -> child: the victims' trace is over


class AttackProcess(Generic[T]):
    """One attack in a child process: ``start`` (blocks until the child is ready), ``go``,
    ``finish`` (stop and collect). ``close`` ends the child however the run ended."""

    def __init__(self, call: AttackCall[T], priority: str = "normal") -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority {priority!r} is invalid; expected one of {PRIORITIES}")
        receive, send = _CONTEXT.Pipe(duplex=False)
        self._receive = receive
        self._events = _Events(send, _CONTEXT.Event(), _CONTEXT.Event())
        self._process = _CONTEXT.Process(
            target=_child, args=(call, self._events, priority), name="loraplex-attacker"
        )

    def start(self) -> None:
        self._process.start()
        self._events.conn.close()  # the parent's copy of the sending end: EOF once the child exits
        if self._receive_message(READY_TIMEOUT_S) != "ready":
            raise AttackProcessError("the attack process did not report ready")

    def go(self) -> None:
        self._events.go.set()

    def finish(self) -> AttackResult[T]:
        """Sets ``stop`` and waits for the child's result (blocking: call it off the loop)."""
        self._events.stop.set()
        message = self._receive_message(STOP_TIMEOUT_S)
        self._process.join(STOP_TIMEOUT_S)
        if isinstance(message, tuple) and message[0] == "tally":
            result: AttackResult[T] = message[1]
            return result
        why = message[1] if isinstance(message, tuple) else message
        raise AttackProcessError(f"the attack process failed: {why}")

    def close(self) -> None:
        """Stops the child (asked first; killed if it does not end) and frees its resources."""
        self._events.go.set()  # a child waiting for go must not wait forever
        self._events.stop.set()
        if self._process.pid is not None:
            self._process.join(STOP_TIMEOUT_S)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._process.close()
        self._receive.close()

    def _receive_message(self, timeout_s: float) -> Any:
        if not self._receive.poll(timeout_s):
            raise AttackProcessError(f"the attack process sent nothing within {timeout_s} s")
        try:
            return self._receive.recv()
        except EOFError as exc:
            code = self._process.exitcode
            raise AttackProcessError(f"the attack process exited (code {code})") from exc
