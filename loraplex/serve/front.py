"""The front: what the HTTP process runs over any engine (a child process, a thread here, or a
fleet's replicas): the app, its dependencies, the tenant refresher, the release controller and
the live page's history. ``loraplex serve`` (``serve/assembly.py``) and a fleet's ingress
(``fleet/ingress.py``) both build it with ``build_front``.

Torch-free: with the engine in its own process the HTTP process loads no torch
(``tests/test_layering.py`` checks the imports, ``tests/server/test_front_torch_free.py``
a running server).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import MonotonicClock
from loraplex.engine.merge_holds import MergeHoldControl
from loraplex.engine.protocol import EngineClient
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.process import EngineProcess
from loraplex.registry import Registry
from loraplex.release.traffic import ReleaseTraffic
from loraplex.router.fleet_state import FleetStateSource
from loraplex.serve.bootstrap import ADMIN_KEY_FILE
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_settings import tenant_settings, warn_small_gpu_caps
from loraplex.serve.local_fleet import LocalFleetState
from loraplex.serve.operator_pins import PinKey
from loraplex.serve.release_env import (
    ReleaseService,
    ServeReleaseEnv,
    release_traffic,
    start_releases,
)
from loraplex.serve.tracing import build_tracer
from loraplex.server.app import create_app
from loraplex.server.auth import ADMIN_ACTOR
from loraplex.server.cache_control import CacheControl
from loraplex.server.chat import ChatTemplate
from loraplex.server.deps import ServerConfig, ServerDeps
from loraplex.server.history import HistorySampler
from loraplex.server.listeners import ConnectionLimits
from loraplex.server.pin_owners import OPERATOR, OwnedPins, RegistryPins

if TYPE_CHECKING:
    from loraplex.engine.factory import AdapterRuntime


class RunningEngine(EngineClient, Protocol):
    """An engine client the server owns: ``Server.close()`` shuts it down."""

    def shutdown(self) -> None: ...


@dataclass
class Server:
    """A built server: the app and what must be closed after it stops."""

    app: FastAPI  # the ASGI application
    deps: ServerDeps  # what the app was built from
    engine: RunningEngine  # the running engine (a thread here, a child process, or a fleet)
    runtime: AdapterRuntime | None  # slot pool and adapter cache when the engine runs here
    registry: Registry  # control plane
    admin_key: str  # the admin credential
    sample_keys: dict[str, str] = field(default_factory=dict)  # demo tenant -> API key
    releases: ReleaseService | None = None  # the release controller's thread; None: not started
    history: HistorySampler | None = None  # samples the live page's history; None: not started

    def wait_engine(self, timeout_s: float | None = None) -> None:
        """Returns once the engine took its first requests; raises why it could not start (the
        engine child's own error). At once for an engine on a thread (built synchronously)."""
        if isinstance(self.engine, EngineProcess):
            self.engine.wait_started(timeout_s)

    def close(self) -> None:
        if self.history is not None:
            self.history.close()
        if self.releases is not None:
            self.releases.close()
        if self.deps.tracing is not None:
            self.deps.tracing.shutdown()
        self.engine.shutdown()
        if self.runtime is not None:
            self.runtime.cache.close()
        self.registry.close()


class TenantRefresher:
    """Re-reads the registry's tenants into the engine side (the admin API's hook)."""

    def __init__(
        self, registry: Registry, apply: Callable[[Mapping[str, TenantSettings]], None]
    ) -> None:
        self._registry = registry
        self._apply = apply
        self._lock = threading.Lock()  # two admin calls must not apply out of order

    def __call__(self) -> None:
        with self._lock:
            self._apply(tenant_settings(self._registry))


@dataclass(frozen=True)
class Front:
    """The engine side as the HTTP side reaches it (a local engine, an engine process, or a
    fleet's engine replicas), and the credentials the front is built with."""

    engine: RunningEngine  # AsyncEngine | EngineProcess | a fleet's FleetEngineClient
    cache: CacheControl  # the engine side's adapter cache(s)
    apply_tenants: Callable[[Mapping[str, TenantSettings]], None]  # tenant settings to it
    admin_key: str  # the admin credential
    sample_keys: dict[str, str]  # demo tenant -> API key (printed once)
    # the engine side's holds against merging (admin guard, docs/modes.md); None: it never merges
    merge_holds: MergeHoldControl | None = None


def build_front(
    config: ServeConfig,
    model_dir: Path,
    base: BaseModelSpec,
    registry: Registry,
    front: Front,
    *,
    runtime: AdapterRuntime | None = None,
    release_env: Callable[[OwnedPins, ReleaseTraffic], ServeReleaseEnv] | None = None,
    fleet: FleetStateSource | None = None,
    operator_pins: Iterable[PinKey] = (),
) -> Server:
    """The HTTP app, its dependencies and the release controller over ``front``: what
    ``loraplex serve`` and a fleet's ingress share. ``release_env``: the controller's
    environment (default: ``ServeReleaseEnv`` over this engine and cache); ``fleet``: what
    /admin/fleet shows (default: this server as a fleet of one); ``operator_pins``: the
    operator's pins the registry restored (``serve/operator_pins.py``), which the cache holds
    already (its engine pinned them) and are recorded as the operator's."""
    settings = ServerConfig(
        base_model_name=base.name,
        admin_key=front.admin_key,
        # a key given by --admin-key / LORAPLEX_ADMIN_KEY is fixed; one kept in the data
        # directory is re-read when its file changes (rotation without a restart)
        admin_key_file=None if config.admin_key else config.data_dir / ADMIN_KEY_FILE,
        import_dir=config.import_dir,
        queue_deadline_s=config.queue_deadline_s,
        max_prompt_tokens=config.max_model_len - 1,
        max_model_len=config.max_model_len,
        vocab_size=base.vocab_size,
        metrics_public=config.metrics_public,
        max_adapter_labels=config.max_adapter_labels,
        max_body_bytes=config.body_bytes(),
        max_upload_bytes=config.max_upload_bytes,
        max_prompt_chars=config.prompt_chars(),
        body_read_timeout_s=config.body_read_timeout_s,
        upload_read_timeout_s=config.upload_read_timeout_s,
        max_stream_buffer_bytes=config.max_stream_buffer_bytes,
        stream_pause_bytes=config.stream_pause_bytes,
        max_stream_resumes=config.max_stream_resumes,
        shared_state_url=config.shared_state_url,
        shared_state_prefix=config.shared_state_prefix,
        request_log_path=config.request_log_path,
        gpu_slot_bytes=config.slot_bytes(base),
    )
    chat = ChatTemplate.from_model_dir(model_dir)
    # a release's holds and an operator's pins never undo each other; the operator's are recorded
    cache = OwnedPins(front.cache, RegistryPins(registry, ADMIN_ACTOR))
    cache.adopt(dict.fromkeys(operator_pins, OPERATOR))
    refresh = TenantRefresher(registry, front.apply_tenants)
    warn_small_gpu_caps(tenant_settings(registry), config.slot_bytes(base))
    traffic = release_traffic(registry)
    deps = ServerDeps(
        settings,
        front.engine,
        registry,
        cache,
        chat,
        refresh_tenants=refresh,
        releases=traffic,
        # one per app: it keeps the eviction window
        fleet=fleet or LocalFleetState(front.engine, cache, MonotonicClock()),
        tracing=build_tracer(config, base.name),
        merge_holds=front.merge_holds,
    )
    server = Server(
        create_app(deps), deps, front.engine, runtime, registry, front.admin_key, front.sample_keys
    )
    server.releases = start_releases(registry, front.engine, cache, traffic, env=release_env)
    server.history = HistorySampler(server.app.state.history, MonotonicClock())
    server.history.start()
    return server


def connection_limits(settings: ServeConfig) -> ConnectionLimits:
    """The listener's connection bounds from ``settings``: ``loraplex serve``'s listener and a
    fleet ingress's (``fleet/listener.py``) read the same keys."""
    return ConnectionLimits(
        header_read_timeout_s=settings.header_read_timeout_s,
        keep_alive_timeout_s=settings.keep_alive_timeout_s,
        max_connections=settings.max_connections,
        max_header_bytes=settings.max_header_bytes,
        max_header_count=settings.max_header_count,
        max_unauthenticated_connections=settings.max_unauthenticated_connections,
        max_connections_per_address=settings.max_connections_per_address,
        accepts_per_s_per_address=settings.accepts_per_s_per_address,
        max_tenant_connection_share=settings.max_tenant_connection_share,
        ipv6_address_prefix=settings.ipv6_address_prefix,
        write_timeout_s=settings.write_timeout_s,
        min_send_bytes_per_s=settings.min_send_bytes_per_s,
        max_unsent_response_bytes=settings.max_unsent_response_bytes,
        send_buffer_bytes=settings.send_buffer_bytes,
    )
