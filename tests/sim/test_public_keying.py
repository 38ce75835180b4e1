"""Another tenant's public adapter, as the request log names it (``owner/name@revision``), is
keyed by its owner in the simulator as in the server: its callers share one copy."""

from __future__ import annotations

from sim_inputs import cost

from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import adapter_place, simulate, trace_adapters
from loraplex.sim.trace import TraceRecord


def test_a_public_adapter_named_by_its_owner_is_one_copy() -> None:
    """``owner/name@rev`` (the request log's name for another tenant's public adapter) is the
    owner's adapter: its callers share one copy, a second caller hits it in a slot."""
    assert adapter_place("u", "pub/a@r2") == ("pub", "a@r2")
    assert adapter_place("pub", "a@r2") == ("pub", "a@r2")
    assert adapter_place("u", "a@x/y") == ("u", "a@x/y")  # a slash in the revision only
    trace = [TraceRecord(0.0, "pub", "a@r1", 16, 4), TraceRecord(1.0, "u", "pub/a@r1", 16, 4)]
    config = SimConfig(max_loras=2)
    assert len(trace_adapters(trace, config)) == 1
    kept: list[Outcome] = []
    result = simulate(trace, config, cost(), keep_outcomes=kept)
    assert [o.tier for o in kept] == ["L3", "L0"]
    assert result.config["trace_adapters"] == 1
