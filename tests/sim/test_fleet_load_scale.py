"""A fleet replica's loads priced by ``CostModel.fleet_load_scale`` (read, written, refused by
name; a file without it prices them by ``fleet_cpu_scale``, as before) and fitted on lone cold
requests through the fleet: their loads' stage seconds as the fleet's stage counters read them,
over the loads' lone price (``sim/calibrate_fleet.fit_load_scale``; simstage)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import cost

from loraplex.sim.calibrate_fleet import (
    LOAD_LINKS,
    MIN_STAGE_SAMPLES,
    FleetSample,
    fit_fleet,
    fit_load_scale,
    load_price_s,
    stage_load_ratios,
    ttft_load_ratios,
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


def _timed(model: object, nbytes: int, scale: float, **fields: object) -> FleetSample:
    """A cold request whose load took ``scale`` times each link's lone price of ``nbytes``."""
    links = model.links  # type: ignore[attr-defined]
    stages = tuple(scale * links[name].seconds(nbytes) for name in LOAD_LINKS)
    return FleetSample(8, 8, nbytes, 0.05, cold=True, load_stages_s=stages, **fields)  # type: ignore[arg-type]


def test_the_fit_recovers_a_known_scale_from_the_stage_seconds_alone() -> None:
    """Synthetic loads of known scale over two sizes, some disturbed: the median recovers it,
    whatever the requests' TTFT (the hop, ask and step priced around the load play no part),
    per link too; warm requests and cold ones without stage seconds are left out."""
    model = replace(cost(), network_s=0.004, fleet_cpu_scale=1.2)
    warm = [FleetSample(8, 8, 1000, 0.02), FleetSample(8, 8, 1000, 0.021)]
    warm += [FleetSample(8, 8, 1000, 0.02, 0.004)]
    untimed = FleetSample(8, 8, 1000, 0.5, cold=True)
    colds = [_timed(model, n, 1.3) for n in (200_000, 2_000_000, 200_000, 2_000_000, 900_000)]
    colds += [_timed(model, 2_000_000, 4.0), _timed(model, 200_000, 0.9)]  # disturbed, both ways
    ttfts = (0.01, 0.9, 0.03, 0.2, 0.05, 0.07, 1.0)
    colds = [replace(c, ttft_s=t) for c, t in zip(colds, ttfts, strict=True)]
    fit = fit_load_scale(model, [*warm, untimed, *colds])
    assert fit.scale == pytest.approx(1.3)
    assert fit.samples == len(colds) and fit.ratios == pytest.approx([1.3] * 5 + [4.0, 0.9])
    assert fit.link_ratios == pytest.approx(dict.fromkeys(LOAD_LINKS, 1.3))
    assert stage_load_ratios(model, [colds[5], *warm, untimed]) == pytest.approx([4.0])
    assert fit_fleet(model, warm + colds) == fit_fleet(model, warm)  # the cold ones left out


def test_the_per_link_ratios_show_which_link_the_fleet_slows() -> None:
    """Only the copy slowed (x3): the whole load's ratio sits between 1 and 3, weighted by the
    links' prices, and the copy's own ratio says which link it was."""
    model = cost()
    nbytes = 1_000_000
    prices = [model.links[name].seconds(nbytes) for name in LOAD_LINKS]
    stages = (prices[0], prices[1], 3.0 * prices[2])
    sample = FleetSample(8, 8, nbytes, 0.05, cold=True, load_stages_s=stages)
    fit = fit_load_scale(model, [sample] * MIN_STAGE_SAMPLES)
    assert fit.link_ratios == pytest.approx({"L3_to_L2": 1.0, "L2_to_L1": 1.0, "L1_to_L0": 3.0})
    assert fit.scale == pytest.approx(sum(stages) / load_price_s(model, sample))
    assert 1.0 < fit.scale < 3.0


def test_too_few_timed_samples_are_refused_naming_the_key() -> None:
    model = cost()
    timed = [_timed(model, 500_000, 1.5)] * (MIN_STAGE_SAMPLES - 1)
    untimed = [FleetSample(8, 8, 500_000, 0.05, cold=True)] * 5  # cold, no stage seconds
    with pytest.raises(ValueError, match="fleet_load_scale has too few samples: 2 cold"):
        fit_load_scale(model, timed + untimed)
    with pytest.raises(ValueError, match="0 cold requests with their load's stage seconds"):
        fit_load_scale(model, [])
    assert fit_load_scale(model, timed, min_samples=2).scale == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"load_stages_s": (0.01, 0.01, 0.01)}, "cold"),  # a warm request has no load
        ({"cold": True, "load_stages_s": (0.01, 0.01)}, "3 finite"),
        ({"cold": True, "load_stages_s": (0.01, -0.001, 0.01)}, ">= 0"),
        ({"cold": True, "load_stages_s": (0.01, float("nan"), 0.01)}, "finite"),
        ({"cold": True, "load_stages_s": (0.0, 0.0, 0.0)}, "summing > 0"),
    ],
)
def test_bad_stage_seconds_are_refused_by_name(fields: dict, why: str) -> None:
    with pytest.raises(ValueError, match=f"load_stages_s.*{why}"):
        FleetSample(8, 8, 1000, 0.05, **fields)


def test_a_sample_with_stage_seconds_round_trips_through_its_json() -> None:
    """A report's samples (``asdict``, JSON: a list) read back to the same sample."""
    import dataclasses

    sample = FleetSample(8, 64, 9000, 0.05, cold=True, load_stages_s=(0.011, 0.002, 0.0005))
    body = json.loads(json.dumps(dataclasses.asdict(sample)))
    assert body["load_stages_s"] == [0.011, 0.002, 0.0005]
    assert FleetSample(**body) == sample


def test_the_ttft_ratios_are_kept_for_the_reports_unfloored() -> None:
    """The fit before simstage, kept beside the stage fit in the reports: each cold request's
    TTFT less the hop, ask, L3 hand-off and scaled prefill step, over its load's price."""
    model = replace(
        cost(), network_s=0.004, fleet_cpu_scale=1.2, lease_ask_s=0.0005,
        lease_handoff_s={"L3": 0.001},
    )  # fmt: skip
    nbytes = 2_000_000
    around = model.front_s + model.ipc_s + 0.004 + 0.0005 + 0.001
    probe = FleetSample(8, 8, nbytes, 1.0, cold=True)
    step = 1.2 * probe.prefill_price_s(model)
    load = load_price_s(model, probe)
    colds = [replace(probe, ttft_s=around + step + k * load) for k in (2.0, 4.0)]
    warm = [FleetSample(8, 8, 1000, 0.02)]
    assert ttft_load_ratios(model, [colds[1], *warm, colds[0]]) == pytest.approx([4.0, 2.0])
    fast = FleetSample(8, 8, 1000, 0.0001, cold=True)
    assert ttft_load_ratios(model, [fast])[0] < 0


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


def test_each_cold_samples_load_is_what_the_fleets_stage_counters_grew_by(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The counters are read once before the first request and once after each, before its
    eviction (which times no stage): a kept sample's ``load_stages_s`` is the growth per link
    (resolve, fetch, verify and commit: L3 -> L2; read; copy); a fall (a replica left the sum)
    or no growth keeps the sample without stage seconds; a request left out reads them too."""
    import random

    from loraplex.bench.serve.driver import DriveConfig, RequestRecord
    from loraplex.bench.sim import fleet_lone
    from loraplex.bench.workloads import TraceAdapter

    events: list[str] = []
    answers = iter([("L3", 200), ("L1", 200), ("L3", 200), ("L3", 200), ("L3", 200)])

    async def send_one(url: str, request: object, **_: object) -> RequestRecord:
        tier, status = next(answers)
        events.append("send")
        return RequestRecord(0.0, "t", "a", tier, status, 0.05, None, 1, "r", None, 0.1)

    totals = iter(
        [
            {"resolve": 0.0, "fetch": 1.0, "verify": 0.5, "commit": 0.1, "read": 2.0, "copy": 0.3},
            {"resolve": 0.001, "fetch": 1.01, "verify": 0.502, "commit": 0.1, "read": 2.003,
             "copy": 0.3005},
            {"resolve": 0.001, "fetch": 1.01, "verify": 0.502, "commit": 0.1, "read": 2.003,
             "copy": 0.3005},  # the L1 hit: nothing loaded from the store
            {"fetch": 0.5, "read": 1.0, "copy": 0.1},  # fell: a replica left the sum
            {"fetch": 0.5, "read": 1.0, "copy": 0.1},  # grew by nothing
            {"fetch": 0.52, "read": 1.004, "copy": 0.1006, "room_wait": 9.0},
        ]
    )  # fmt: skip

    def stages() -> dict[str, float]:
        events.append("stages")
        return next(totals)

    monkeypatch.setattr(fleet_lone, "send_one", send_one)
    cold = [(TraceAdapter("t", f"c{i}", 8, ()), 1000) for i in range(5)]
    samples, left_out = fleet_lone.cold_samples(
        "http://x", "k", cold, gap_s=0.0, rng=random.Random(0),
        drive=DriveConfig(request_timeout_s=5.0, vocab_size=100),
        evict=lambda adapter: events.append("evict"), stages=stages,
    )  # fmt: skip
    assert events == ["stages"] + ["send", "stages", "evict"] * 5
    assert left_out == 1
    loads = [s.load_stages_s for s in samples]
    assert loads[0] == pytest.approx((0.013, 0.003, 0.0005))
    assert loads[1:3] == [None, None]
    assert loads[3] == pytest.approx((0.02, 0.004, 0.0006))  # room_wait is no link's stage
