"""Simulations whose results were recorded before the simulator's speed work (commit ba7c122):
``test_sim_speed.py`` checks that the current code still gives every one of them byte for byte.
Each case exercises a different part: one server and fleets, cold loads and load quotas, tenant
classes, a shared loader CPU, automatic warm rebalancing, preemption and deadlines."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace

from sim_inputs import cost, scenario

from loraplex.engine.tenant_shares import TenantSettings
from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
from loraplex.sim.scale import synthetic_trace

# The simulator's context length and KV blocks when these were recorded (its defaults then; they
# are ``loraplex serve``'s since), passed explicitly so that the recorded results stay valid.
_RECORDED = {"max_model_len": 2048, "num_kv_blocks": 4096}

_CLASSES = {
    "prio": TenantSettings.for_priority("high"),
    "batch": TenantSettings.for_priority("batch"),
}


def _run(name: str, config: SimConfig, *, shared: bool = False, **kw: float) -> Callable[[], str]:
    def result() -> str:
        model = replace(cost(), load_cpu_shared=True) if shared else cost()
        return simulate(scenario(name, **kw), config, model).to_json()

    return result


def _scale() -> str:
    trace = synthetic_trace(1000, 400, 20.0 * 8, seed=0)
    return simulate(trace, SimConfig(replicas=8, **_RECORDED), cost()).to_json()


CASES: dict[str, Callable[[], str]] = {
    "zipf-single": _run("zipf-longtail", SimConfig(max_loras=4, **_RECORDED), duration_s=10),
    "hot-fleet": _run("hot-burst", SimConfig(replicas=3, max_loras=4, **_RECORDED), duration_s=10),
    "cold-scarce": _run(
        "cold-storm",
        SimConfig(
            max_loras=2,
            max_lora_rank=128,
            max_concurrent_loads=1,
            tenant_max_concurrent_loads=1,
            queue_deadline_s=0.5,
            **_RECORDED,
        ),
        duration_s=6,
        rate=40,
    ),
    "hot-classes-shared-cpu": _run(
        "hot-burst",
        SimConfig(max_loras=6, tenants=_CLASSES, auto_warm_interval_s=2.0, **_RECORDED),
        shared=True,
        duration_s=10,
    ),
    "zipf-tight-kv": _run(
        "zipf-longtail",
        SimConfig(max_num_seqs=4, num_kv_blocks=24, block_size=16, max_loras=4, max_model_len=384),
        duration_s=6,
        rate=30,
    ),
    "scale-8": _scale,
}


def digest(result_json: str) -> str:
    return hashlib.sha256(result_json.encode()).hexdigest()
