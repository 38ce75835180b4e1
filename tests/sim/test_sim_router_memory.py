"""The simulated fleet's router forgets a request's decision as load at its end, as the fleet's
engine client has the real one do (``routing.UNADMITTED``: ``Router.finish`` after a first token,
``Router.withdraw`` before one): a replica's finished requests are not its pending load until
its next report."""

from __future__ import annotations

from sim_inputs import cost

from loraplex.router import RouterConfig
from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_finished_requests_are_no_pending_load_between_reports() -> None:
    """One revision's short requests, one every 50 ms, each done long before the next; no new
    report for 100 s. On main each stayed its replica's pending load until that report (within
    ``recent_ttl_s``), so after ``max_queued`` of them the holder looked saturated and the rest
    went elsewhere, cold (``saturated`` decisions); now all go to the one replica, one load."""
    max_queued = RouterConfig().max_queued
    trace = [TraceRecord(0.05 * i, "acme", "support", 8, 1) for i in range(4 * max_queued)]
    config = SimConfig(replicas=3, max_loras=4, report_interval_s=100.0)
    metrics = simulate(trace, config, cost()).metrics
    assert metrics["completed_ratio"] == 1.0
    # no report since the first: each is placed (its rendezvous replica, the same every time)
    assert metrics["decisions"] == {"placement": len(trace)}
    assert metrics["l0_hit_ratio"] == round((len(trace) - 1) / len(trace), 4)  # one load
