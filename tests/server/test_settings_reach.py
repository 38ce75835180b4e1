"""Issue 26: every field of the cache, runtime and scheduler configs is either set from the
serve config, or listed here as internal with the reason. ``max_auto_gpu_slots`` was neither
(never set, so automatic L0 promotion could not happen in ``loraplex serve``); a new field
fails this test until it is wired or listed."""

from __future__ import annotations

import ast
import inspect
from dataclasses import fields
from pathlib import Path

from loraplex.engine import factory
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.factory import AdapterRuntimeConfig
from loraplex.residency.cache.config import CacheConfig
from loraplex.serve import engine_settings, engine_side
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_settings import engine_config

INTERNAL: dict[type, dict[str, str]] = {
    AdapterRuntimeConfig: {},
    CacheConfig: {
        "tenant_priority": "set per tenant from the registry (set_tenant_limits), live",
        "reload_window_s": "a statistics window (what counts as a reload), no behaviour",
        "default_deadline_s": "the engine passes every acquire its request's own deadline",
        "max_request_deferral_s": "a bound on any policy's deferral; docs say not a setting",
        "bandwidth_bytes_per_s": "the cost model's prior; measured copies refine it",
        "miss_stall_s": "the keep-score's fixed cost of a miss, a modelling constant",
        "max_idle_keys": "a memory bound on request histories kept for evicted keys",
        "victim_order_horizon_s": "a cost/accuracy knob of the victim index, no behaviour",
    },
    SchedulerConfig: {
        "lease_lookahead": "how far the fair order looks for adapters to lease, internal",
        "prefetch_lookahead": "how far it looks for adapters to prefetch, internal",
        "retry_hint_s": "the Retry-After hint of queue errors, a constant",
    },
    EngineConfig: {
        "idle_wait_s": "the loop's sleep when idle (woken early), no behaviour",
    },
}


def _keywords(module: object, function: str, callee: str) -> set[str]:
    """The keyword arguments ``function`` in ``module`` passes to ``callee(...)``."""
    tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())  # type: ignore[arg-type]
    (found,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    calls = [
        n
        for n in ast.walk(found)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == callee
    ]
    assert calls, f"{function} does not call {callee}"
    return {k.arg for c in calls for k in c.keywords if k.arg is not None}


def _check(config: type, set_from_serve: set[str]) -> None:
    names = {f.name for f in fields(config)}
    internal = set(INTERNAL[config])
    assert not set_from_serve & internal, f"{config.__name__}: both set and internal"
    assert names - set_from_serve - internal == set(), (
        f"{config.__name__} fields neither set from ServeConfig nor listed as internal"
    )
    assert internal <= names, f"{config.__name__}: INTERNAL lists fields that do not exist"


def test_every_runtime_field_is_set_from_the_serve_config() -> None:
    _check(AdapterRuntimeConfig, _keywords(engine_side, "build_runtime", "AdapterRuntimeConfig"))


def test_every_cache_field_is_set_from_the_runtime_config_or_internal() -> None:
    passed = _keywords(factory, "build_adapter_runtime", "CacheConfig")
    _check(CacheConfig, passed | {"budgets"})  # budgets: positional, from max_loras and bytes
    runtime = {f.name for f in fields(AdapterRuntimeConfig)}
    assert passed - {"budgets"} <= runtime  # each from the runtime config's field of its name


def test_every_scheduler_and_engine_field_is_set_from_the_serve_config() -> None:
    _check(SchedulerConfig, _keywords(engine_settings, "engine_config", "SchedulerConfig"))
    _check(EngineConfig, _keywords(engine_settings, "engine_config", "EngineConfig"))


def test_the_scheduler_and_engine_fields_carry_the_serve_values(tmp_path: Path) -> None:
    serve = ServeConfig(
        data_dir=tmp_path,
        max_num_seqs=7,
        max_num_batched_tokens=99,
        max_model_len=300,
        queue_deadline_s=12.5,
        max_queue_len=33,
        class_reserve_seqs=2,
        step_work_ratio=1.5,
        max_paused_kv_fraction=0.5,
        block_size=8,
        num_kv_blocks=77,
        dtype="bfloat16",
        device="cuda:3",  # a valid name, not the default (not looked up here)
        base_linear_kernel="blas",
        mode="auto",
        merge_step_budget_s=0.03,
    )
    built = engine_config(serve)
    assert built.base_linear_kernel == "blas"
    assert (built.mode, built.merge_step_budget_s) == ("auto", 0.03)
    scheduler = built.scheduler
    assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (7, 99)
    assert (scheduler.max_model_len, scheduler.default_deadline_s) == (300, 12.5)
    assert (scheduler.max_queue_len, scheduler.class_reserve_seqs) == (33, 2)
    assert (scheduler.step_work_ratio, scheduler.max_paused_kv_fraction) == (1.5, 0.5)
    assert (built.block_size, built.num_kv_blocks, built.dtype, built.device) == (
        8,
        77,
        "bfloat16",
        "cuda:3",
    )


def test_the_request_log_path_reaches_the_server_config() -> None:
    """Issue 30: ``request_log_path`` is handed from the serve config to the HTTP layer."""
    from loraplex.serve import front

    assert "request_log_path" in _keywords(front, "build_front", "ServerConfig")


def test_the_stream_pause_settings_reach_the_server_config() -> None:
    """Issue 25: what bounds a stuck stream's pauses is handed to the HTTP layer."""
    from loraplex.serve import front

    passed = _keywords(front, "build_front", "ServerConfig")
    assert {"stream_pause_bytes", "max_stream_resumes"} <= passed


def test_the_admin_key_file_reaches_the_server_config() -> None:
    """tidy7: the file a kept admin key is re-read from is handed to the HTTP layer (the
    ingress of a fleet builds its server through ``build_front`` too)."""
    from loraplex.fleet import ingress
    from loraplex.serve import front

    assert {"admin_key", "admin_key_file"} <= _keywords(front, "build_front", "ServerConfig")
    assert _keywords(ingress, "build_ingress", "build_front") >= {"release_env", "fleet"}


def _calls(module: object, function: str, callee: str) -> list[ast.Call]:
    """The calls of ``callee(...)`` (a plain name) in ``function`` (or method) of ``module``."""
    tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())  # type: ignore[arg-type]
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    return [
        n
        for f in found
        for n in ast.walk(f)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == callee
    ]


def test_the_log_level_reaches_uvicorn_and_every_process_that_logs() -> None:
    """logs: ``log_level`` is handed to uvicorn's config in ``serve`` and in a fleet's ingress,
    and sets the ``loraplex`` handler where each process starts: ``serve``, its engine child
    (a spawned restart inherits nothing), ``fleet up`` and the fleet's two kinds of replica."""
    from loraplex.cli import fleet as fleet_cli
    from loraplex.cli import serve as serve_cli
    from loraplex.cli import serve_start
    from loraplex.fleet import deployments, listener
    from loraplex.serve import worker

    assert "log_level" in _keywords(serve_start, "listen", "ListenerConfig")
    (ingress_call,) = _calls(listener, "__init__", "ListenerConfig")
    assert "log_level" in {k.arg for k in ingress_call.keywords}
    starts = [
        (serve_cli, "_start_and_serve"),
        (worker, "engine_worker"),
        (fleet_cli, "up_command"),
        (deployments, "__init__"),
    ]
    for module, function in starts:
        calls = _calls(module, function, "configure_logging")
        assert calls, f"{function} does not configure logging"
        for call in calls:
            (arg,) = call.args
            assert ast.unparse(arg).endswith(".log_level"), ast.unparse(arg)
    assert len(_calls(deployments, "__init__", "configure_logging")) == 2  # engine and ingress
