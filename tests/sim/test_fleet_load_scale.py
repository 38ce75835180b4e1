"""A fleet replica's loads priced by ``CostModel.fleet_load_scale`` (read, written, refused by
name; a file without it prices them by ``fleet_cpu_scale``, as before) and fitted on lone cold
requests through the fleet (``sim/calibrate_fleet.fit_load_scale``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import cost

from loraplex.sim.calibrate_fleet import (
    MIN_LOAD_SCALE,
    FleetSample,
    fit_fleet,
    fit_load_scale,
    load_scale_ratios,
)
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import Link, from_dict, load
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord


def test_the_scale_round_trips_and_a_file_without_it_reads_as_none(tmp_path: Path) -> None:
    model = replace(cost(), fleet_load_scale=2.5)
    model.save(tmp_path / "f.json")
    assert load(tmp_path / "f.json") == model
    assert "fleet_load_scale" not in json.loads(cost().to_json())
    assert from_dict(json.loads(cost().to_json())).fleet_load_scale is None


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), "fast"])
def test_a_bad_scale_is_refused_by_name(value: object) -> None:
    body = json.loads(cost().to_json())
    body["fleet_load_scale"] = value
    with pytest.raises(ValueError, match="fleet_load_scale"):
        from_dict(body)


def _ttft_ms(model: object, replicas: int) -> float:
    trace = [TraceRecord(0.0, "t", "a", 16, 4)]
    metrics = simulate(trace, SimConfig(replicas=replicas), model).metrics  # type: ignore[arg-type]
    return float(metrics["ttft_ms"]["p50"])


def test_a_fleet_replicas_loads_cost_the_load_scale_and_a_lone_servers_do_not() -> None:
    """Links of 10 ms each, a step scale of 1.0: a lone cold request through a 2-replica fleet
    takes 3 x 10 ms x (3 - 1) longer with a load scale of 3; one server is unchanged."""
    links = {name: Link(0.010, 1e18) for name in cost().links}
    plain = replace(cost(), links=links, fleet_cpu_scale=1.0)
    scaled = replace(plain, fleet_load_scale=3.0)
    assert _ttft_ms(scaled, 2) == pytest.approx(_ttft_ms(plain, 2) + 60.0, abs=0.5)
    assert _ttft_ms(scaled, 1) == _ttft_ms(plain, 1)


def test_the_load_scale_is_fitted_on_the_cold_requests_only() -> None:
    model = replace(
        cost(), network_s=0.004, fleet_cpu_scale=1.2, lease_ask_s=0.0005,
        lease_handoff_s={"L3": 0.001},
    )  # fmt: skip
    warm = [FleetSample(8, 8, 1000, 0.02), FleetSample(8, 8, 1000, 0.021)]
    warm += [FleetSample(8, 8, 1000, 0.02, 0.004)]
    assert fit_load_scale(model, warm) is None
    nbytes = 2_000_000
    around = model.front_s + model.ipc_s + 0.004 + 0.0005 + 0.001
    probe = FleetSample(8, 8, nbytes, 1.0, cold=True)
    step = 1.2 * probe.prefill_price_s(model)
    load = sum(link.seconds(nbytes) for link in model.links.values())
    colds = [replace(probe, ttft_s=around + step + k * load) for k in (2.0, 2.5, 4.0)]
    assert fit_load_scale(model, warm + colds) == pytest.approx(2.5)
    assert fit_fleet(model, warm + colds) == fit_fleet(model, warm)  # the cold ones left out
    # each cold request's own ratio, in the order given, warm ones skipped (the report's)
    assert load_scale_ratios(model, [colds[2], *warm, colds[0]]) == pytest.approx([4.0, 2.0])
    assert load_scale_ratios(model, warm) == []


def test_the_ratios_are_kept_unfloored_and_the_fit_floored() -> None:
    """A cold request faster than the hop and step priced around its load has a ratio below
    0; the report keeps it as measured, the fit's median is floored at ``MIN_LOAD_SCALE``."""
    model = replace(cost(), network_s=0.004, fleet_cpu_scale=1.0)
    fast = [FleetSample(8, 8, 1000, 0.0001, cold=True)] * 3
    ratios = load_scale_ratios(model, fast)
    assert all(r < 0 for r in ratios)
    assert fit_load_scale(model, fast) == MIN_LOAD_SCALE


def test_the_cold_samples_keep_the_requests_the_fleet_loaded_from_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One lone request per cold adapter; a failed one and one the fleet found cached (L1) are
    left out, and the kept one carries its adapter's rank and bytes."""
    import random

    from loraplex.bench.serve.driver import DriveConfig, RequestRecord
    from loraplex.bench.sim import fleet_lone
    from loraplex.bench.workloads import TraceAdapter

    answers = iter([("L3", 200, 0.05), ("L1", 200, 0.02), ("L3", 503, None)])

    async def send_one(url: str, request: object, **_: object) -> RequestRecord:
        tier, status, ttft = next(answers)
        return RequestRecord(
            0.0, "t", "a", tier, status, ttft, None, 1, "r", None if status == 200 else "x", 0.1
        )

    monkeypatch.setattr(fleet_lone, "send_one", send_one)
    cold = [
        (TraceAdapter("t", f"c{i}", rank, ()), 1000 * rank) for i, rank in enumerate((8, 64, 8))
    ]
    drive = DriveConfig(request_timeout_s=5.0, vocab_size=100)
    samples, left_out = fleet_lone.cold_samples(
        "http://x", "k", cold, gap_s=0.0, rng=random.Random(0), drive=drive
    )
    assert samples == [FleetSample(8, 8, 8000, 0.05, cold=True)] and left_out == 2
