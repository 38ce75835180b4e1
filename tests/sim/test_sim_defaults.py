"""A planner sizes a fleet on the simulator's defaults: each must be what ``loraplex serve``
(and a fleet) runs with when not told otherwise. ``max_model_len`` (2048 vs 512) and
``num_kv_blocks`` (4096 vs 1024) differed."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from loraplex.engine.config import EngineConfig
from loraplex.fleet.settings import DEFAULT_REPORT_PERIOD_S, FleetSettings
from loraplex.serve.config.record import DEFAULT_CPU_ADAPTER_BYTES, ServeConfig
from loraplex.sim.config import SimConfig

# SimConfig fields with a ServeConfig field of the same name and meaning.
SAME_NAME = (
    "max_loras", "max_lora_rank", "disk_cache_bytes", "max_num_seqs", "max_model_len",
    "num_kv_blocks", "block_size", "queue_deadline_s", "max_queue_len", "step_work_ratio",
    "max_concurrent_loads", "tenant_max_concurrent_loads", "default_tenant_tier_share",
    "auto_warm", "auto_warm_interval_s", "max_auto_gpu_slots",
)  # fmt: skip


def _defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in fields(cls)}


def test_every_shared_default_is_the_servers() -> None:
    sim, serve = SimConfig(), _defaults(ServeConfig)
    assert {name: getattr(sim, name) for name in SAME_NAME} == {n: serve[n] for n in SAME_NAME}


def test_defaults_under_other_names_are_the_servers_too() -> None:
    sim, serve, fleet = SimConfig(), _defaults(ServeConfig), _defaults(FleetSettings)
    # serve's max_num_batched_tokens unset: max(512, max_num_seqs)
    assert sim.max_num_batched_tokens == ServeConfig(Path("unused")).batched_tokens()
    assert serve["cpu_adapter_bytes"] is None and serve["max_cpu_loras"] is None
    assert sim.cpu_adapter_bytes == DEFAULT_CPU_ADAPTER_BYTES
    assert sim.eviction_policy == serve["policy"]
    assert sim.routing_policy == fleet["policy"]
    assert sim.report_interval_s == DEFAULT_REPORT_PERIOD_S
    assert sim.idle_wait_s == EngineConfig().idle_wait_s
