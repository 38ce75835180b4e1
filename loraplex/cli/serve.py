"""``loraplex serve``: the OpenAI-compatible server with its admin API and metrics.

Without arguments it serves the generated demo model and adapters from the default data
directory, and prints the admin key and, when it issues them (first start), an API key per demo
tenant. Flags override the ``--config`` TOML file, which overrides the defaults (see
docs/operations.md).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loraplex.cli.locations import DatabaseUrl, DataDir, S3Endpoint, Store
from loraplex.cli.serve_options import (
    AdminKey,
    Host,
    LogLevel,
    MaxLoras,
    Model,
    NoDemo,
    Port,
    SharedStateUrl,
    bad_parameter,
)
from loraplex.cli.serve_start import (
    assemble,
    bind_sockets,
    check_fds,
    default_torch_threads,
    digest_ahead,
    discard_child,
    freeze_startup_objects,
    listen,
    say_how_to_get_a_tenant_key,
    start_engine_child,
)
from loraplex.cli.vllm_flags import VllmAwareCommand
from loraplex.dtypes import DEFAULT_DTYPE, DTYPE_NAMES
from loraplex.registry import default_data_dir
from loraplex.residency.policy import DEFAULT_POLICY, policy_names

if TYPE_CHECKING:
    from loraplex.serve.config import ServeConfig

# default_torch_threads and freeze_startup_objects: this module's names before the start-up steps
# moved to ``serve_start.py``
__all__ = [
    "check_before_keys",
    "default_torch_threads",
    "freeze_startup_objects",
    "register",
    "serve_command",
    "serve_settings",
]

Opt = typer.Option


def register(app: typer.Typer) -> None:
    app.command("serve", cls=VllmAwareCommand)(serve_command)


def serve_command(
    ctx: typer.Context,
    *,
    config: Annotated[
        Path | None, Opt(help="TOML file (a 'serve' table; keys are the flag names).")
    ] = None,
    host: Host = None,
    port: Port = None,
    model: Model = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
    shared_state_url: SharedStateUrl = None,
    shared_state_prefix: Annotated[
        str | None, Opt(help="Key prefix in that Redis (default: loraplex).")
    ] = None,
    admin_key: AdminKey = None,
    import_dir: Annotated[Path | None, Opt(help="Admin registration by path: root.")] = None,
    max_loras: MaxLoras = None,
    max_cpu_loras: Annotated[int | None, Opt(help="CPU cache size in max-rank adapters.")] = None,
    max_lora_rank: Annotated[int | None, Opt(help="Largest adapter rank (default: 64).")] = None,
    gpu_adapter_bytes: Annotated[int | None, Opt(help="GPU slot byte budget.")] = None,
    cpu_adapter_bytes: Annotated[int | None, Opt(help="CPU cache byte budget (1 GiB).")] = None,
    disk_cache_bytes: Annotated[int | None, Opt(help="Disk cache byte budget (8 GiB).")] = None,
    policy: Annotated[
        str | None, Opt(help=f"Eviction: {', '.join(policy_names())} ({DEFAULT_POLICY}).")
    ] = None,
    mode: Annotated[
        str | None, Opt(help="unmerged (default), merged:<tenant/name@revision> or auto.")
    ] = None,
    max_concurrent_loads: Annotated[
        int | None, Opt(help="Adapter loads in flight, all tenants (default: 4).")
    ] = None,
    tenant_max_concurrent_loads: Annotated[
        int | None, Opt(help="Adapter loads in flight per tenant (default: 2).")
    ] = None,
    auto_warm: Annotated[
        bool | None,
        Opt("--auto-warm/--no-auto-warm", help="Warm hot adapters by their rates (default: on)."),
    ] = None,
    auto_warm_interval_s: Annotated[
        float | None, Opt(help="Seconds between automatic warm rebalances (default: 5).")
    ] = None,
    max_auto_gpu_slots: Annotated[
        int | None, Opt(help="GPU slots automatic warm promotion may pin (max_loras / 4).")
    ] = None,
    device: Annotated[str | None, Opt(help="torch device (default: cpu).")] = None,
    dtype: Annotated[
        str | None, Opt(help=f"One of {', '.join(DTYPE_NAMES)} (default: {DEFAULT_DTYPE}).")
    ] = None,
    max_num_seqs: Annotated[int | None, Opt(help="Sequences at once (default: 32).")] = None,
    max_num_batched_tokens: Annotated[
        int | None, Opt(help="Tokens per forward (default: max(512, max_num_seqs)).")
    ] = None,
    max_model_len: Annotated[int | None, Opt(help="Prompt + output tokens (default: 512).")] = None,
    queue_deadline_s: Annotated[float | None, Opt(help="Queue limit, s (default: 30).")] = None,
    metrics_public: Annotated[
        bool | None, Opt("--metrics-public/--metrics-private", help="/metrics without a key.")
    ] = None,
    access_log: Annotated[
        bool | None,
        Opt("--access-log/--no-access-log", help="One stdout line per HTTP request (default: on)."),
    ] = None,
    log_level: LogLevel = None,
    max_adapter_labels: Annotated[
        int | None, Opt(help="Adapters named in /metrics labels; the rest __other__ (64).")
    ] = None,
    admin_host: Annotated[
        str | None, Opt(help="Admin API address (default: --host; needs --admin-port).")
    ] = None,
    admin_port: Annotated[
        int | None, Opt(help="Serve /admin and /metrics only on this port (default: off).")
    ] = None,
    engine_process: Annotated[
        bool | None,
        Opt("--engine-process/--engine-thread", help="Engine in its own process (default)."),
    ] = None,
    engine_hung_after_s: Annotated[
        float | None, Opt(help="No engine progress with work pending: hung after, s (10).")
    ] = None,
    engine_hung_kill_after_s: Annotated[
        float | None, Opt(help="A hung engine process is restarted after a further, s (20).")
    ] = None,
    engine_unresponsive_after_s: Annotated[
        float | None, Opt(help="Engine process silent with work pending: hung after, s (0.5).")
    ] = None,
    no_demo: NoDemo = False,
    threads: Annotated[
        int | None, Opt(help="torch threads (default: OMP_NUM_THREADS, else cores - 1).")
    ] = None,
    max_body_bytes: Annotated[
        int | None, Opt(help="Largest request body (default: 4 x 16 x prompt chars + 1 MiB).")
    ] = None,
    max_upload_bytes: Annotated[int | None, Opt(help="Largest adapter upload (1 GiB).")] = None,
    max_prompt_chars: Annotated[
        int | None, Opt(help="Longest prompt text (default: 64 x max_model_len).")
    ] = None,
    body_read_timeout_s: Annotated[float | None, Opt(help="Body deadline, s (30).")] = None,
    upload_read_timeout_s: Annotated[float | None, Opt(help="Upload deadline, s (600).")] = None,
    header_read_timeout_s: Annotated[
        float | None, Opt(help="Request head deadline, s (10).")
    ] = None,
    keep_alive_timeout_s: Annotated[int | None, Opt(help="Idle keep-alive, s (5).")] = None,
    max_connections: Annotated[int | None, Opt(help="Open connections (1024).")] = None,
    max_header_bytes: Annotated[int | None, Opt(help="Largest request head (16 KiB).")] = None,
    max_header_count: Annotated[
        int | None, Opt(help="Header lines of a request head; 431 beyond (100).")
    ] = None,
    max_unauthenticated_connections: Annotated[
        int | None, Opt(help="Open connections not yet authenticated (max_connections / 2).")
    ] = None,
    max_connections_per_address: Annotated[
        int | None, Opt(help="Open connections from one client IP (512).")
    ] = None,
    accepts_per_s_per_address: Annotated[
        int | None, Opt(help="New connections per second from one client IP (512).")
    ] = None,
    max_tenant_connection_share: Annotated[
        float | None,
        Opt(
            help="Fraction of max-connections a tenant may hold while others are turned away (0.5)."
        ),
    ] = None,
    ipv6_address_prefix: Annotated[
        int | None,
        Opt(help="IPv6 clients count for the per-IP bounds per network of this /length (64)."),
    ] = None,
    write_timeout_s: Annotated[
        float | None,
        Opt(help="Cut off a client taking under min-send-bytes-per-s x this of it, s (30)."),
    ] = None,
    min_send_bytes_per_s: Annotated[
        int | None, Opt(help="Slowest pace a client may take its answer at, bytes/s (16 KiB).")
    ] = None,
    max_unsent_response_bytes: Annotated[
        int | None,
        Opt(help="Answer bytes waiting for slow clients, all connections; slowest cut (256 MiB)."),
    ] = None,
    max_stream_buffer_bytes: Annotated[
        int | None, Opt(help="Unread stream bytes before the request is aborted (256 KiB).")
    ] = None,
    send_buffer_bytes: Annotated[
        int | None, Opt(help="Kernel send buffer per connection, SO_SNDBUF (256 KiB).")
    ] = None,
    stream_pause_bytes: Annotated[
        int | None,
        Opt(help="Unread stream bytes from which its generation pauses until read (64 KiB)."),
    ] = None,
    max_stream_resumes: Annotated[
        int | None,
        Opt(help="Times a paused stream may resume after a stall before it is cut (16)."),
    ] = None,
) -> None:
    """Serve the base model and its adapters over an OpenAI-compatible HTTP API."""
    try:
        settings = serve_settings(ctx.params, os.environ)
    except (ValueError, TypeError) as exc:
        raise bad_parameter(exc, ctx.params["config"]) from exc
    _run(settings)


def serve_settings(params: Mapping[str, Any], environ: Mapping[str, str]) -> ServeConfig:
    """The configuration from the parsed flags (``params``: flag name -> value, None when not
    given) over the ``--config`` file over the defaults. Every flag but ``config``,
    ``no_demo`` and ``threads`` is the ServeConfig field of its name."""
    from loraplex.serve.config import merge, read_config_file

    flags = dict(params)
    config = flags.pop("config")
    flags["demo"] = False if flags.pop("no_demo") else None
    flags["torch_threads"] = flags.pop("threads")
    file_values = read_config_file(config) if config is not None else {}
    if "data_dir" not in file_values:  # a default, under the flags (no flag of the user's)
        file_values["data_dir"] = default_data_dir(environ, Path.home())
    return merge(file_values, flags, check_before_keys)


def check_before_keys(settings: ServeConfig) -> None:
    """The checks that would otherwise fail only once the server (or a fleet's replica) is
    built, after a first start issued the demo tenants' keys: the engine's own
    (class_reserve_seqs, KV room for one max_model_len sequence), ``import_dir``,
    ``request_log_path`` and a ``trace_endpoint`` without its extra. ``serve`` and ``fleet up``
    run them before anything starts."""
    from loraplex.serve.engine_settings import engine_config
    from loraplex.serve.tracing import check_tracing_installed

    engine_config(settings)
    settings.check_import_dir()
    settings.check_request_log_path()
    check_tracing_installed(settings)


def _run(settings: ServeConfig) -> None:
    # No collection until freeze_startup_objects: what start-up builds lives as long as the
    # process, and the collections during it (25-124 ms each, seen in the front) free next to
    # nothing, as in the engine child's startup_collections.
    gc.disable()
    try:
        _start_and_serve(settings)
    finally:
        gc.enable()


def _start_and_serve(settings: ServeConfig) -> None:
    threads = settings.torch_threads
    if threads is None:
        threads = default_torch_threads(os.environ.get("OMP_NUM_THREADS"), os.cpu_count())
    settings = replace(settings, torch_threads=threads)  # the engine process sets them too
    from loraplex.serve.logs import configure_logging

    configure_logging(settings.log_level)  # before the engine child's fork, which inherits it
    check_fds(settings)
    # Then the engine child, at once: it imports torch (a second or more) while this process
    # binds, imports its HTTP side and opens the registry; build_server then tells it what to
    # build. It is killed if anything before that fails.
    engine_child = start_engine_child(settings) if settings.engine_process else None
    digest = digest_ahead(settings)  # after the fork
    try:
        if threads is not None and not settings.engine_process:
            import torch

            torch.set_num_threads(threads)
        sockets = bind_sockets(settings)
    except BaseException:
        discard_child(engine_child)
        raise
    from loraplex.serve.bootstrap import ADMIN_KEY_FILE

    new_admin_key = settings.admin_key is None and not (settings.data_dir / ADMIN_KEY_FILE).exists()
    server = assemble(settings, engine_child, sockets, digest)
    failed = threading.Event()  # set when the engine's first start fails
    try:
        shown_admin_key = server.admin_key if new_admin_key else None
        _announce(settings, shown_admin_key, server.sample_keys)
        freeze_startup_objects()
        listen(settings, server, sockets, failed)
    except KeyboardInterrupt:
        typer.echo("stopped")
    finally:
        server.close()
    if failed.is_set():
        raise typer.Exit(1)


def _announce(settings: ServeConfig, admin: str | None, keys: dict[str, str]) -> None:
    """The addresses, and secrets only when they were just created (``admin`` None: the admin
    key was given, or generated by an earlier start and kept in the data dir)."""
    url = f"http://{settings.host}:{settings.port}"
    typer.echo(f"loraplex serving on {url}  (OpenAI API at {url}/v1)")
    admin_url = url
    if settings.admin_port is not None:
        admin_url = f"http://{settings.admin_host or settings.host}:{settings.admin_port}"
        typer.echo(f"admin API and /metrics only on {admin_url}")
    typer.echo(f"dashboard:  {admin_url}/admin/dashboard#key=<admin key>")
    if admin is not None:
        typer.echo(f"admin key:   {admin}  (shown once; kept in {settings.data_dir}/admin-key)")
    elif settings.admin_key is None:
        typer.echo(f"admin key:   shown only when generated; kept in {settings.data_dir}/admin-key")
    for tenant, tenant_key in sorted(keys.items()):
        typer.echo(f"{tenant + ' key:':<12} {tenant_key}")
    if not keys:  # tenant keys are shown once, when issued
        say_how_to_get_a_tenant_key(settings)
    token = keys.get("acme")
    if token is not None:
        typer.echo(
            f"try: curl {url}/v1/completions -H 'Authorization: Bearer {token}' "
            "-H 'Content-Type: application/json' "
            '-d \'{"model": "support", "prompt": "The acme support team", "max_tokens": 9, '
            '"temperature": 0}\''
        )
