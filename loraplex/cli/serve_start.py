"""``loraplex serve``'s start-up steps, in the order ``cli/serve.py`` runs them: the descriptor
check, the engine child, the sockets, the server, the listener (stopped if the engine's first
start fails), and the garbage collector's freeze in between. Each step that fails on the
configuration prints an 'error:' line and exits 1. The HTTP side is imported inside the steps:
``loraplex serve --help`` and the engine child's spawn do not wait for it.
"""

from __future__ import annotations

import gc
import shlex
import socket
import threading
from typing import TYPE_CHECKING

import typer

from loraplex.cli.locations import unusable_path

if TYPE_CHECKING:
    import uvicorn

    from loraplex.artifacts.base_model import DigestedCheckpoint
    from loraplex.background import Background
    from loraplex.engine.transport.process_link import ChildLink
    from loraplex.serve.config import ServeConfig
    from loraplex.serve.front import Server


def check_fds(settings: ServeConfig) -> None:
    """Before anything is started or built: the connection caps must fit the descriptors
    (ListenerConfig rechecks); an 'error:' line and exit 1 when they do not."""
    from loraplex.server.connections import MAX_WAITING
    from loraplex.server.fd_limit import ensure_fd_limit
    from loraplex.server.tarpit import MAX_HELD

    try:  # held off (tarpit.py) or waiting for room (connections.py)
        ensure_fd_limit(settings.max_connections, MAX_HELD + MAX_WAITING)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def bind_sockets(settings: ServeConfig) -> list[socket.socket]:
    """The listening sockets; an 'error:' line and exit 1 when one is taken (before the model
    loads)."""
    from loraplex.server.listeners import bind_all

    try:
        return bind_all(settings.host, settings.port, settings.admin_host, settings.admin_port)
    except OSError as exc:
        typer.echo(f"error: cannot listen: {exc}", err=True)
        raise typer.Exit(1) from exc


def start_engine_child(settings: ServeConfig) -> ChildLink:
    """The engine child, forked now; with a configured model it starts loading it at once
    (``serve.worker.spawn_engine_child``)."""
    from loraplex.serve.worker import spawn_engine_child

    return spawn_engine_child(settings)


def digest_ahead(settings: ServeConfig) -> Background[DigestedCheckpoint] | None:
    """The configured base model's digest (``build_server`` needs it before it can tell the
    engine child what to build), started now on a thread beside this process's imports: on
    the large preset 720 MiB of sha256, which followed them. Call it after the engine child's
    fork (a fork must not copy a running thread). None for the demo set, whose directory is
    known once its set is there."""
    if settings.model is None:
        return None
    from loraplex.artifacts.base_model import digest_checkpoint
    from loraplex.background import Background

    model_dir = settings.model
    return Background(lambda: digest_checkpoint(model_dir), "loraplex-digest")


def discard_child(engine_child: ChildLink | None) -> None:
    """Kills an engine child nothing will build (a no-op once its engine closed it)."""
    if engine_child is not None:
        engine_child.kill()
        engine_child.close()


def assemble(
    settings: ServeConfig,
    engine_child: ChildLink | None,
    sockets: list[socket.socket],
    digest: Background[DigestedCheckpoint] | None = None,
) -> Server:
    """The whole server, its engine process left starting (/health live, /ready 503 until it
    is up); an 'error:' line and exit 1 on a configuration error, the sockets closed.
    ``digest``: ``digest_ahead``'s."""
    from loraplex.errors import LoraplexError

    try:
        from loraplex.serve.assembly import build_server  # the HTTP side: a while to import
    except BaseException:
        discard_child(engine_child)
        raise
    say_demo_generation(settings)
    try:  # build_server owns the child from here (and kills it when it fails)
        return build_server(
            settings, wait_engine=False, engine_child=engine_child, digest_ahead=digest
        )
    except (LoraplexError, ValueError, OSError) as exc:
        for sock in sockets:
            sock.close()
        message = unusable_path(exc) if isinstance(exc, OSError) else str(exc)
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1) from exc


def say_demo_generation(settings: ServeConfig) -> None:
    """One line before the first start trains the demo set, which printed nothing for minutes
    (about 3 on a loaded 2-core machine) before the keys."""
    from loraplex.serve.assembly import demo_assets_to_generate

    data_dir = settings.data_dir
    if data_dir.exists() and not data_dir.is_dir():
        return  # nothing will be generated: the start fails next, naming it
    out = demo_assets_to_generate(settings)
    if out is not None:
        typer.echo(
            f"generating the demo model and adapters into {out} (first start only; a few "
            "minutes on a small CPU machine)",
            err=True,
        )


def say_how_to_get_a_tenant_key(settings: ServeConfig) -> None:
    """On a start that issued no tenant key: the command that issues one, on this data dir (a
    bare `loraplex keys create TENANT` after `serve --data-dir D` looked in the default one),
    with the ``loraplex`` the operator ran (``serve/program.py``; ``serve`` and ``fleet up``)."""
    from loraplex.serve.program import program

    data_dir = shlex.quote(str(settings.data_dir))
    typer.echo(
        "tenant keys: shown only when issued; "
        f"`{program()} keys create TENANT --data-dir {data_dir}` makes one"
    )


def listen(
    settings: ServeConfig, server: Server, sockets: list[socket.socket], failed: threading.Event
) -> None:
    """Serves on ``sockets`` until stopped, or until the engine's first start fails."""
    import uvicorn

    from loraplex.serve.front import connection_limits
    from loraplex.server.listeners import ListenerConfig, guarded

    # The app has no startup/shutdown hooks: resources are built before and closed after.
    config = ListenerConfig(
        guarded(server.app, sockets),
        connection_limits(settings),
        log_level=settings.log_level,
        metrics=server.deps.metrics.registry,
        access_log=settings.access_log,
    )
    listener = uvicorn.Server(config)
    threading.Thread(
        target=_stop_if_engine_fails, args=(server, listener, failed), daemon=True
    ).start()
    listener.run(sockets=sockets)


def _stop_if_engine_fails(
    server: Server, listener: uvicorn.Server, failed: threading.Event
) -> None:
    """A first engine start that fails is a configuration error: stop serving and exit 1 (a
    later crash is the supervisor's to restart). Whatever the child raised: a ValueError
    (``num_kv_blocks`` too small for ``max_model_len``) or torch's RuntimeError (an unknown
    ``device``) used to kill this thread only, leaving a server that answered 503 forever."""
    try:
        server.wait_engine()
    except Exception as exc:  # NOTE: any first-start failure; the child's error says which
        typer.echo(f"error: the engine did not start: {exc}", err=True)
        failed.set()
        listener.should_exit = True


def freeze_startup_objects() -> None:
    """Moves everything built so far (model, registry, app, caches) out of the garbage
    collector's view, as vLLM does after start-up: a full collection otherwise walks all of it
    and stalls every stream for tens of milliseconds while requests allocate."""
    gc.collect()
    gc.freeze()
    gc.enable()  # off since ``serve._run`` began


def default_torch_threads(omp_num_threads: str | None, num_cores: int | None) -> int | None:
    """Threads for torch when none were configured: None (torch's own choice, which honours it)
    when OMP_NUM_THREADS is set, else all cores but one. NOTE: with every core in torch's pool,
    its intra-op threads and the event loop thread preempt each other on small machines."""
    if omp_num_threads:
        return None
    return max(1, (num_cores or 1) - 1)
