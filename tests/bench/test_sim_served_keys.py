"""``bench sim``'s simulated fleet places cold revisions as the real one does: its replicas are
named by rank (``rank-0``, .., the fleet router's names) and its adapters keyed as the real runs'
servers key them (``served_keys``, from the registry they serve), and the router's placement is a
hash of the two (docs/simulator.md, "simrank")."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.bench.sim.bench import prepared
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.simulated import served_keys
from loraplex.bench.workloads import ScenarioParams, generate
from loraplex.registry import RegistryConfig, open_registry
from loraplex.router.placement import rank_name, rendezvous_order
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.profiles import load_profile
from loraplex.sim.run import adapter_key, simulate
from loraplex.sim.trace import TraceRecord


def test_served_keys_are_the_registrys_and_place_the_simulated_fleet_as_the_real_one(
    tmp_path: Path,
    demo_assets,  # type: ignore[no-untyped-def]
) -> None:
    workload = generate("zipf-longtail", 0, ScenarioParams(duration_s=2, rate=2, num_adapters=6))
    config = SimBenchConfig(traces=("zipf-longtail",), trace_requests=4, num_adapters=6)
    registry = prepared(config, [workload], tmp_path, demo_assets.base_model_dir)
    adapters = list(workload.adapters)
    keys = served_keys(registry, adapters)
    opened = open_registry(
        RegistryConfig(registry.root, registry.database_url, str(registry.store))
    )
    try:
        for a in adapters:
            served = opened.get_revision(f"{a.tenant}/{a.name}@r1").key()
            assert keys[(a.tenant, a.name)] == served != adapter_key(a.tenant, a.name)
    finally:
        opened.close()
    # one request per adapter, far apart (each finds the fleet idle): each goes to the first
    # rank of its served key's rendezvous order, where the real fleet's router sends it
    trace = [TraceRecord(5.0 * i, a.tenant, a.name, 8, 2) for i, a in enumerate(adapters)]
    kept: list[Outcome] = []
    cost = load_profile("h100-sxm-llama2-7b-bf16")
    simulate(trace, SimConfig(replicas=3), cost, keep_outcomes=kept, adapter_keys=keys)
    ranks = [rank_name(i) for i in range(3)]
    expected = [rendezvous_order(str(keys[(a.tenant, a.name)]), ranks)[0] for a in adapters]
    assert [ranks[o.replica] for o in kept] == expected


def test_adapter_keys_that_are_not_keys_of_their_owner_are_refused() -> None:
    trace = [TraceRecord(0.0, "t", "a", 8, 2)]
    cost = load_profile("h100-sxm-llama2-7b-bf16")
    other = adapter_key("u", "a")
    for keys, words in [
        ({("t", "a"): "t/a@r1"}, "expected the AdapterKey"),
        ({("t", "a"): other}, "an adapter of 't'"),
        ({("t", "a"): adapter_key("t", "b"), ("t", "b"): adapter_key("t", "b")}, "one key per"),
    ]:
        with pytest.raises(ValueError, match=f"adapter_keys.*{words}"):
            simulate(trace, SimConfig(), cost, adapter_keys=keys)  # type: ignore[arg-type]
