"""Errors across a process boundary: the engine child's pipe (``transport/messages.py``) and
a fleet's Ray calls (``fleet/wire.py``) carry an exception as a ``PackedError``.

An error crosses as (module, class name, args, attributes) and is rebuilt without calling the
class's ``__init__``: domain errors have keyword-rich constructors that pickle cannot replay.
"""

from __future__ import annotations

import importlib
from typing import Any

# (module, class name, args, attributes): an exception rebuilt by ``unpack_error``.
PackedError = tuple[str, str, tuple[Any, ...], dict[str, Any]]


def pack_error(exc: BaseException) -> PackedError:
    """A picklable description of ``exc`` (its class by module and name, args and attributes)."""
    cls = type(exc)
    state = {k: v for k, v in vars(exc).items() if _plain(v)}
    args = tuple(a for a in exc.args if _plain(a))
    return (cls.__module__, cls.__qualname__, args, state)


def unpack_error(packed: PackedError) -> BaseException:
    """The exception ``pack_error`` described; RuntimeError when its class cannot be found."""
    module, qualname, args, state = packed
    try:
        cls = getattr(importlib.import_module(module), qualname)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(qualname)
        exc = cls.__new__(cls)
        BaseException.__init__(exc, *args)
        exc.__dict__.update(state)
        return exc
    except Exception:  # an unknown class: keep the message
        return RuntimeError(f"{module}.{qualname}: {args[0] if args else ''}")


def _plain(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | tuple | list | dict)
