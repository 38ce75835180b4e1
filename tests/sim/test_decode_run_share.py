"""A decode run (``sim/decode_run.py``) never starts while a tenant is over its equal share:
the step-share rule may hold that tenant's decodes back a few steps on, as their contexts grow
(a decode row's work is its context), and the run's next plan then was no steady decode step
(RuntimeError: "a decode run's next step is not a steady decode step")."""

from __future__ import annotations

from sim_inputs import cost

from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_a_tenant_over_its_share_that_grows_past_the_ratio_mid_run() -> None:
    # ``hog`` holds 5 of 8 seats (its equal share: 4), short contexts; ``small`` one long one.
    # At first ``small``'s row is the more work, so nobody waits and the batch is steady; the
    # hog's 5 contexts grow 5 tokens a step to its 1, and ~90 steps on the hog is the busiest
    # and held back: the batch is no longer a steady decode step.
    trace = [TraceRecord(0.0, "hog", None, 16, 1000) for _ in range(5)]
    trace.append(TraceRecord(0.001, "small", None, 4500, 1000))
    config = SimConfig(max_model_len=8192, num_kv_blocks=4096, max_num_seqs=8)
    stepped = simulate(trace, config, cost(), skip_steps=False)
    assert stepped.metrics["completed"] == 6
    assert simulate(trace, config, cost()).to_json() == stepped.to_json()
