"""Build a whole server for ``loraplex serve``: registry, engine (with its adapter cache), app.

Order matters: the registry first (demo bootstrap, keys), then the engine side
(``serve/engine_side.py``: adapter runtime, whose ``recover()`` adopts the verified disk copies of
the previous run, the operators' warm policies, the engine core), the app last.
``Server.close()`` undoes it in reverse.

Two ways to run the engine (``ServeConfig.engine_process``):

- in a child process (the default): ``EngineProcess`` spawns it and ``build_worker`` builds
  the engine side there; the HTTP process keeps the registry (auth, resolution, admin) and the
  tokenizer, and reaches the cache through ``RemoteCache``;
- on a thread of this process: ``AsyncEngine`` over the same pieces, built here (tests that
  reach into the runtime use this).

Tenants' priority classes and quotas reach the cache and the engine through
``tenant_settings(registry)``; the admin API calls ``deps.refresh_tenants()`` after it creates or
changes a tenant, so the change applies without a restart.

With ``wait_engine=False`` (process mode) ``build_server`` returns while the engine process still
loads the model, so the listener can answer /health (liveness) at once; /ready answers 503 until
the engine is up, and ``Server.wait_engine()`` raises why its first start failed.

The release controller (``serve/release_env.py``) ticks on its own thread in this process from
the start (it waits while the engine is down); ``Server.close()`` stops it before the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import MonotonicClock
from loraplex.demo.manifest import DemoAssets
from loraplex.engine.factory import AdapterRuntime
from loraplex.engine.process import EngineProcess
from loraplex.engine.protocol import EngineClient
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.thread_client import AsyncEngine
from loraplex.model.tokenizer import TextTokenizer
from loraplex.registry import Registry, open_registry
from loraplex.release.traffic import ReleaseTraffic
from loraplex.serve.bootstrap import admin_key, register_demo, sample_keys
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_side import (
    apply_warm_policies,
    build_runtime,
    build_worker,
    engine_config,
    registry_config,
    tenant_settings,
    watchdog_policy,
)
from loraplex.serve.release_env import (
    ReleaseService,
    ServeReleaseEnv,
    release_traffic,
    start_releases,
)
from loraplex.serve.tracing import build_tracer
from loraplex.server.app import create_app
from loraplex.server.cache_control import CacheControl
from loraplex.server.chat import ChatTemplate
from loraplex.server.deps import ServerConfig, ServerDeps
from loraplex.server.fleet_view import FleetStateSource
from loraplex.server.history import HistorySampler
from loraplex.server.pin_owners import OwnedPins

DEMO_DIR = "demo-assets"


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


def demo_assets(config: ServeConfig) -> DemoAssets | None:
    """The generated demo set when no model is configured (generation imports torch)."""
    if config.model is not None:
        return None
    from loraplex.demo.assets import generate_demo_assets

    return generate_demo_assets(config.data_dir / DEMO_DIR, preset="small", seed=0)


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


def build_server(config: ServeConfig, *, wait_engine: bool = True) -> Server:
    """Everything ``loraplex serve`` runs, ready for uvicorn (close it after). ``wait_engine``
    False: an engine process may still be starting (see the module docstring)."""
    config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # secrets inside
    assets = demo_assets(config)
    model_dir = assets.base_model_dir if assets is not None else config.model
    if model_dir is None:
        raise ValueError("model None is invalid; expected a model directory or the demo assets")
    base = BaseModelSpec.from_dir(model_dir)
    registry = open_registry(registry_config(config), base=base)
    try:
        demo = assets if config.demo else None
        return _assemble(config, model_dir, base, registry, demo, wait_engine=wait_engine)
    except BaseException:
        registry.close()
        raise


def _assemble(
    config: ServeConfig,
    model_dir: Path,
    base: BaseModelSpec,
    registry: Registry,
    demo: DemoAssets | None,
    *,
    wait_engine: bool,
) -> Server:
    keys: dict[str, str] = {}
    if demo is not None:
        state = register_demo(registry, demo)
        keys = sample_keys(registry, state.tenants, config.data_dir)
    admin = config.admin_key or admin_key(config.data_dir)
    engine: AsyncEngine | EngineProcess
    cache: CacheControl
    runtime: AdapterRuntime | None = None
    if config.engine_process:
        engine = EngineProcess(
            build_worker,
            (config, model_dir),
            TextTokenizer(model_dir),
            wait_ready=wait_engine,
            watchdog=watchdog_policy(config),
        )
        cache, apply = engine.cache, engine.update_tenant_settings
    else:
        runtime = _runtime_here(config, base, registry)
        try:
            engine = _start_engine(model_dir, config, runtime)
        except BaseException:
            runtime.cache.close()
            raise
        cache, apply = runtime.cache, runtime.update_tenant_settings
    front = Front(engine, cache, apply, admin, keys)
    try:
        return build_front(config, model_dir, base, registry, front, runtime=runtime)
    except BaseException:
        engine.shutdown()
        if runtime is not None:
            runtime.cache.close()
        raise


@dataclass(frozen=True)
class Front:
    """The engine side as the HTTP side reaches it (a local engine, an engine process, or a
    fleet's engine replicas), and the credentials the front is built with."""

    engine: RunningEngine  # AsyncEngine | EngineProcess | a fleet's FleetEngineClient
    cache: CacheControl  # the engine side's adapter cache(s)
    apply_tenants: Callable[[Mapping[str, TenantSettings]], None]  # tenant settings to it
    admin_key: str  # the admin credential
    sample_keys: dict[str, str]  # demo tenant -> API key (printed once)


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
) -> Server:
    """The HTTP app, its dependencies and the release controller over ``front``: what
    ``loraplex serve`` and a fleet's ingress share. ``release_env``: the controller's
    environment (default: ``ServeReleaseEnv`` over this engine and cache); ``fleet``: what
    /admin/fleet shows (default: this server as a fleet of one)."""
    settings = ServerConfig(
        base_model_name=base.name,
        admin_key=front.admin_key,
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
        shared_state_url=config.shared_state_url,
        shared_state_prefix=config.shared_state_prefix,
        request_log_path=config.request_log_path,
    )
    chat = ChatTemplate.from_model_dir(model_dir)
    cache = OwnedPins(front.cache)  # a release's holds and an operator's pins never undo each other
    refresh = TenantRefresher(registry, front.apply_tenants)
    traffic = release_traffic(registry)
    deps = ServerDeps(
        settings,
        front.engine,
        registry,
        cache,
        chat,
        refresh_tenants=refresh,
        releases=traffic,
        fleet=fleet,
        tracing=build_tracer(config, base.name),
    )
    server = Server(
        create_app(deps), deps, front.engine, runtime, registry, front.admin_key, front.sample_keys
    )
    server.releases = start_releases(registry, front.engine, cache, traffic, env=release_env)
    server.history = HistorySampler(server.app.state.history, MonotonicClock())
    server.history.start()
    return server


def _runtime_here(config: ServeConfig, base: BaseModelSpec, registry: Registry) -> AdapterRuntime:
    runtime = build_runtime(config, base, registry)
    try:
        apply_warm_policies(registry, runtime, base.digest)
    except BaseException:
        runtime.cache.close()
        raise
    return runtime


def _start_engine(model_dir: Path, config: ServeConfig, runtime: AdapterRuntime) -> AsyncEngine:
    from loraplex.engine.factory import build_engine

    return build_engine(model_dir, engine_config(config), runtime, watchdog=watchdog_policy(config))
