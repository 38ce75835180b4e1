"""The planner's ``simulate``: a candidate as the simulator's config, run on the planned trace."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loraplex.plan.select import Simulate
from loraplex.plan.space import Candidate
from loraplex.sim.call import simulate_metrics
from loraplex.sim.cost_model import CostModel


def candidate_config(candidate: Candidate, base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (other SimConfig fields, e.g. the trace's rank defaults) with the candidate's
    axes. NOTE: merged replicas are a planner axis the simulator does not model yet; a
    candidate with any is refused here, naming it, rather than simulated as unmerged."""
    if candidate.merged_replicas:
        raise ValueError(
            f"merged_replicas {candidate.merged_replicas}: the simulator does not model merged "
            "replicas yet; sweep merged replicas 0 only"
        )
    routed = dict(base)
    if candidate.replicas < 2:
        # NOTE: the router table (``--router``) is moot with one replica, as its routing policy
        # is: nothing routes (``SimConfig`` refuses a table there)
        routed.pop("router", None)
    return {
        **routed,
        "replicas": candidate.replicas,
        "max_loras": candidate.max_loras,
        "cpu_adapter_bytes": candidate.cpu_adapter_bytes,
        "disk_cache_bytes": candidate.disk_cache_bytes,
        "eviction_policy": candidate.eviction_policy,
        "routing_policy": candidate.routing_policy,
    }


def simulator(trace: list[Any], cost_model: CostModel, base: Mapping[str, Any]) -> Simulate:
    """A ``Simulate`` running ``trace`` under each candidate with ``cost_model``."""

    def run(candidate: Candidate) -> Mapping[str, Any]:
        return simulate_metrics(trace, candidate_config(candidate, base), cost_model)

    return run
