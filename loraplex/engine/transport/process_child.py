"""The engine process's side: its entry point (``child_main``), which names the process, imports
the preloads, builds what the parent's ``Build`` names and serves it (``child_loop.ChildLoop``;
``process.py`` says why the engine has a process; ``messages.py`` lists the messages; a builder
returns ``worker.WorkerHandles``; errors cross as ``packed_errors.PackedError``).

Torch-free at import time: the builder it is given imports torch when it runs, here in the child.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import signal
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

from loraplex.engine.transport.child_loop import ChildLoop
from loraplex.engine.transport.messages import Build, Ready, StartFailed
from loraplex.engine.transport.packed_errors import pack_error
from loraplex.engine.transport.worker import WorkerHandles

# A call the child makes before its preload and its Build: (function, arguments).
Ahead = tuple[Callable[..., object], tuple[object, ...]]

# The engine process's name (Linux truncates it to 15 bytes): ``_name_process``.
ENGINE_PROCESS_NAME = "loraplex-engine"


@contextlib.contextmanager
def startup_collections() -> Iterator[None]:
    """No garbage collection inside the block, then one, and what survives it frozen.

    Start-up allocates objects that live as long as the process (modules, the model, caches):
    collections during it (about a fifth of torch's import time) free next to nothing, and later
    ones need not walk what survives the start. ``gc.freeze()`` inside the block (after imports)
    spares the one collection the imports too; what garbage they left, a few dozen objects,
    then stays."""
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def child_main(
    conn: Connection,
    preload: tuple[str, ...],
    parent_end: Connection | None = None,
    ahead: Ahead | None = None,
) -> None:
    """The child's entry point: makes the ``ahead`` call (``(function, args)``: work that needs
    no ``Build``, started first) and imports ``preload`` (module names) at once, then builds
    what the parent's ``Build`` names and serves it. The parent may spawn the child before it
    knows what to build, so the imports (torch: seconds) overlap the parent's own start.
    ``parent_end``: the parent's end of the pipe, which a forked child inherited; closed at
    once, so the pipe reaches EOF here when the parent dies, however it dies."""
    _ignore_group_signals()
    if parent_end is not None:
        parent_end.close()
    _name_process()
    with startup_collections():
        built = _built(conn, preload, ahead)
    if built is None:
        return
    handles, build = built
    conn.send(Ready(handles.max_loras))  # NOTE: before the engine thread can publish anything
    ChildLoop(conn, handles, build.intervals).run()
    conn.close()


def _built(
    conn: Connection, preload: tuple[str, ...], ahead: Ahead | None = None
) -> tuple[WorkerHandles, Build] | None:
    """The ``ahead`` call made and the preloads imported, then what the parent's ``Build`` names
    built (with the Build); None, the pipe closed, when that failed (reported to the parent) or
    no Build came."""
    try:
        if ahead is not None:
            call, args = ahead
            call(*args)
        for name in preload:
            importlib.import_module(name)
    except BaseException as exc:
        _fail(conn, exc)  # the parent reads it once it has sent the Build
        return None
    gc.freeze()  # the imports: see startup_collections
    try:
        build = conn.recv()
    except (EOFError, OSError):  # the parent went away (or gave up) before it sent one
        return None
    if not isinstance(build, Build):  # Stop: the parent no longer wants this child
        conn.close()
        return None
    try:
        return build.builder(*build.args), build
    except BaseException as exc:
        _fail(conn, exc)
        return None


def _ignore_group_signals() -> None:
    """SIGTERM and SIGINT are left to the parent: sent to the whole process group (a service
    manager's stop, Ctrl-C, ``kill -- -PGID``), they killed this child at once, and the parent,
    not yet told to shut down, reported "engine process ... killed by SIGTERM; restarting it"
    and started another while its own graceful shutdown failed the requests in flight. The
    parent stops this child (``Stop``), and the pipe's EOF does when the parent is gone, however
    it went; SIGKILL still ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _name_process() -> None:
    """``ENGINE_PROCESS_NAME`` as this process's name (Linux ``comm``: what ``ps`` and ``top``
    show, and how ``bench.proc_tree.engine_child`` tells a forked engine from its parent, whose
    command line it shares). Elsewhere it keeps its name."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(ENGINE_PROCESS_NAME, encoding="ascii")


def _fail(conn: Connection, error: BaseException) -> None:
    with contextlib.suppress(OSError, ValueError):  # the parent may be gone
        conn.send(StartFailed(pack_error(error)))
    conn.close()
