"""Build a whole server for ``loraplex serve``: registry, engine (with its adapter cache), app.

Order matters: the registry first (demo bootstrap, keys), then the engine side
(``serve/engine_side.py``: adapter runtime, whose ``recover()`` adopts the verified disk copies of
the previous run, the operators' warm policies, the engine core), the front last
(``serve/front.py``: the app and what it needs). ``Server.close()`` undoes it in reverse.

Two ways to run the engine (``ServeConfig.engine_process``):

- in a child process (the default): ``EngineProcess`` spawns it (or takes the one ``loraplex
  serve`` started first, ``engine_child``) and ``serve/worker.py`` builds the engine side
  there; the HTTP process keeps the registry (auth, resolution, admin) and the tokenizer,
  reaches the cache through ``RemoteCache``, and loads no torch (this module and
  ``serve/front.py`` import nothing that does; the demo set, when it must be generated, is
  generated in a child process too);
- on a thread of this process: ``AsyncEngine`` over the same pieces, built here
  (``engine_side.start_engine_here``, imported only then; tests that reach into the runtime use
  this).

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

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.artifacts.base_model import (
    BaseModelSpec,
    DigestedCheckpoint,
    digest_checkpoint,
    read_model_config,
)
from loraplex.demo.assets import demo_assets_ready, generate_demo_assets, load_demo_assets
from loraplex.demo.manifest import DemoAssets
from loraplex.engine.merge_holds import MergeHoldControl
from loraplex.engine.transport.process import EngineProcess
from loraplex.model.tokenizer import TextTokenizer
from loraplex.registry import Registry, open_registry
from loraplex.serve import operator_pins
from loraplex.serve.bootstrap import admin_key, register_demo, sample_keys
from loraplex.serve.config import ServeConfig, memory_total_bytes
from loraplex.serve.engine_settings import registry_config, watchdog_policy
from loraplex.serve.front import Front, RunningEngine, Server, build_front
from loraplex.serve.merge_target import warn_if_unregistered
from loraplex.serve.worker import ENGINE_PRELOAD, engine_worker

if TYPE_CHECKING:
    from loraplex.background import Background
    from loraplex.engine.factory import AdapterRuntime
    from loraplex.engine.transport.process_link import ChildLink
    from loraplex.server.cache_control import CacheControl

DEMO_DIR = "demo-assets"
DEMO_PRESET, DEMO_SEED = "small", 0


def demo_assets_to_generate(config: ServeConfig) -> Path | None:
    """Where ``demo_assets`` is about to generate the demo set (minutes of training), None when
    a model is configured or the set is already there: the CLI says so before the wait."""
    out = config.data_dir / DEMO_DIR
    if config.model is not None or demo_assets_ready(out.resolve(), DEMO_PRESET, DEMO_SEED):
        return None
    return out


def demo_assets(config: ServeConfig) -> DemoAssets | None:
    """The generated demo set when no model is configured. Generation trains with torch, so a
    set not generated yet is generated in a child process: this one stays torch-free."""
    if config.model is not None:
        return None
    out = config.data_dir / DEMO_DIR
    if not demo_assets_ready(out.resolve(), DEMO_PRESET, DEMO_SEED):
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            pool.submit(generate_demo_assets, out, DEMO_PRESET, DEMO_SEED).result()
    return load_demo_assets(out)


def build_server(
    config: ServeConfig,
    *,
    wait_engine: bool = True,
    engine_child: ChildLink | None = None,
    digest_ahead: Background[DigestedCheckpoint] | None = None,
) -> Server:
    """Everything ``loraplex serve`` runs, ready for uvicorn (close it after). ``wait_engine``
    False: an engine process may still be starting (see the module docstring).
    ``engine_child``: the engine process, spawned ahead (``serve.worker.spawn_engine_child``)
    and owned from here on: it builds once the registry is ready, and is killed if this fails.
    ``digest_ahead``: the configured model's digest, started before (``cli.serve_start``); used
    when it is of the model served, what it raised raised here."""
    if engine_child is not None and not config.engine_process:
        engine_child.kill()
        engine_child.close()
        raise ValueError("engine_child is invalid with engine_process = false; expected None")
    try:
        return _build(config, wait_engine, engine_child, digest_ahead)
    except BaseException:
        if engine_child is not None:  # a no-op when the engine took it and closed it
            engine_child.kill()
            engine_child.close()
        raise


def _build(
    config: ServeConfig,
    wait_engine: bool,
    engine_child: ChildLink | None,
    digest_ahead: Background[DigestedCheckpoint] | None,
) -> Server:
    config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # secrets inside
    assets = demo_assets(config)
    model_dir = assets.base_model_dir if assets is not None else config.model
    if model_dir is None:
        raise ValueError("model None is invalid; expected a model directory or the demo assets")
    digested = _digested(model_dir, digest_ahead)  # the engine process takes it as its own
    base = BaseModelSpec.from_dir(model_dir, digested)
    config.check_context(read_model_config(model_dir))  # before a key is issued
    config.check_kv_memory(base, memory_total_bytes())
    # also before: gpu_adapter_bytes below one slot, or max_auto_gpu_slots not below the slots
    # it leaves (the engine side refused them, after the keys were issued and announced)
    config.auto_gpu_slots(base)
    registry = open_registry(registry_config(config), base=base)
    try:
        demo = assets if config.demo else None
        return _assemble(
            config, model_dir, base, registry, demo, digested=digested, wait_engine=wait_engine,
            child=engine_child,
        )  # fmt: skip
    except BaseException:
        registry.close()
        raise


def _digested(model_dir: Path, ahead: Background[DigestedCheckpoint] | None) -> DigestedCheckpoint:
    digested = None if ahead is None else ahead.result()
    if digested is not None and digested.model_dir == model_dir:
        return digested
    return digest_checkpoint(model_dir)


def _assemble(
    config: ServeConfig,
    model_dir: Path,
    base: BaseModelSpec,
    registry: Registry,
    demo: DemoAssets | None,
    *,
    digested: DigestedCheckpoint,
    wait_engine: bool,
    child: ChildLink | None,
) -> Server:
    keys: dict[str, str] = {}
    if demo is not None:
        state = register_demo(registry, demo)
        keys = sample_keys(registry, state.tenants, config.data_dir)
    warn_if_unregistered(config.mode, registry)  # after the demo's registrations
    admin = config.admin_key or admin_key(config.data_dir)
    engine: RunningEngine
    cache: CacheControl
    runtime: AdapterRuntime | None = None
    holds: MergeHoldControl
    if config.engine_process:
        process = EngineProcess(
            engine_worker,
            (config, model_dir, digested),
            TextTokenizer(model_dir),
            wait_ready=wait_engine,
            watchdog=watchdog_policy(config),
            preload=ENGINE_PRELOAD,
            child=child,
        )
        engine, cache, apply = process, process.cache, process.update_tenant_settings
        holds = process.merge_holds
    else:  # NOTE: the only path of ``loraplex serve`` that loads torch in this process
        from loraplex.serve.engine_side import start_engine_here

        engine, runtime = start_engine_here(config, base, registry, model_dir)
        cache, apply, holds = runtime.cache, runtime.update_tenant_settings, runtime.merge_holds
    front = Front(engine, cache, apply, admin, keys, holds)
    try:
        pins = operator_pins.restore(registry, base.digest)  # the engine side pins them itself
        return build_front(
            config, model_dir, base, registry, front, runtime=runtime, operator_pins=pins
        )
    except BaseException:
        engine.shutdown()
        if runtime is not None:
            runtime.cache.close()
        raise
