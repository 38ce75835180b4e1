"""A call to the fleet's Ray cluster bounded in time: ``fleet status`` and ``fleet down`` connect
from a child process killed at the bound. NOTE: a GCS that accepts connections but never answers
(its process stopped or hung) held Ray's driver connect without end, and nothing in the calling
process could stop it: only a process of its own can be given up on."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


class NoAnswer(RuntimeError):
    """The child did not answer within the bound (it was killed)."""


def check_timeout(timeout_s: float) -> None:
    """``--timeout-s`` refused, by name, unless it is > 0 (before anything is done)."""
    if not timeout_s > 0:
        raise RuntimeError(f"--timeout-s {timeout_s:g} is invalid; expected > 0")


def call_in_child(target: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
    """``target(*args)`` run in a spawned child within ``timeout_s``: its value (picklable);
    NoAnswer when it did not answer in time, RuntimeError when it failed (its message)."""
    check_timeout(timeout_s)
    context = multiprocessing.get_context("spawn")  # NOTE: a fork would copy a driver's state
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_run, args=(target, args, sender), name="loraplex-fleet")
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout_s):
            raise NoAnswer(f"no answer within {timeout_s:g} s")
        ok, value = receiver.recv()
    except EOFError:  # the child died without an answer
        raise RuntimeError(f"the call to the cluster failed (exit code {child.exitcode})") from None
    finally:
        receiver.close()
        child.kill()
        child.join()
    if not ok:
        raise RuntimeError(value)
    return value


def _run(target: Callable[..., Any], args: tuple[Any, ...], sender: Any) -> None:
    """The child: (True, the value) or (False, why not) through ``sender``."""
    try:
        sender.send((True, target(*args)))
    except Exception as exc:  # any failure is the command's one error line
        sender.send((False, str(exc) if isinstance(exc, RuntimeError) else repr(exc)))
