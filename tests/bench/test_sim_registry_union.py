"""The registry ``bench sim`` (and ``plan check``) shares between its workloads registers each
(tenant, name) once, as its first definition: ``workloads.adapter_union``, the helper the serve
and fleet benches use. It kept the last one (a dict built over every workload), so an adapter two
workloads define differently was registered as the later one's while the earlier workload, run
first, was simulated with its own."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loraplex.bench.sim.bench import prepared
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.workloads import ScenarioParams, TraceAdapter, generate
from loraplex.registry import RegistryConfig, open_registry


def test_an_adapter_two_workloads_define_is_registered_as_the_first_defines_it(
    tmp_path: Path,
    demo_assets,  # type: ignore[no-untyped-def]
) -> None:
    base = generate("zipf-longtail", 0, ScenarioParams(duration_s=2, rate=2, num_adapters=2))
    first = replace(base, adapters=(TraceAdapter("acme", "shared", 4, ("q_proj",)),))
    later = replace(base, adapters=(TraceAdapter("acme", "shared", 8, ("q_proj", "v_proj")),))
    config = SimBenchConfig(traces=("zipf-longtail",), trace_requests=4, num_adapters=2)

    fleet = prepared(config, [first, later], tmp_path, demo_assets.base_model_dir)

    registry = open_registry(RegistryConfig(fleet.root, fleet.database_url, str(fleet.store)))
    try:
        (adapter,) = registry.list_adapters()
        revision = registry.get_revision("acme/shared@r1")
    finally:
        registry.close()
    assert (adapter.tenant, adapter.name) == ("acme", "shared")
    assert (revision.max_rank, revision.target_modules) == (4, ("q_proj",))
