"""``sim calibrate-fleet``'s measuring loop (``bench/sim/calibrate_fleet._measure``) against a
stand-in ingress: warms each adapter until it is served from a GPU slot, sends the lone requests
paced as the lone server's calibration does (one function, ``calibrate_run.paced_requests``),
keeps only warm successful requests, counts the rest as left out, places the contention rounds'
adapters one per replica (``contention_rounds.place``) and times the rounds. No Ray, no
server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loraplex.bench.serve.driver import DriveConfig, RequestRecord
from loraplex.bench.sim import calibrate_run, contention_rounds, fleet_lone
from loraplex.bench.sim.calibrate_fleet import FleetCalibrateConfig, _measure
from loraplex.bench.sim.fleet_lone import COLD_REQUESTS, cold_adapters
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter, TraceRequest

ADAPTERS = [TraceAdapter("t", "r8", 8, ATTENTION_TARGETS), TraceAdapter("t", "r64", 64, ())]
SIZES = {("t", "r8"): 1000, ("t", "r64"): 8000}
DRIVE = DriveConfig(request_timeout_s=5.0, vocab_size=100)


def _fake_ingress(monkeypatch: pytest.MonkeyPatch, cold_first: int, fail_every: int = 0) -> dict:
    """Each adapter's first ``cold_first`` requests are served cold (tier L3); every
    ``fail_every``-th request after that fails (0: none). Lone single requests (warming,
    contention rounds) and paced replays (``replay``) go through the same stand-in; what each
    sent is kept apart."""
    sent: dict[str, list[Any]] = {"all": [], "paced": []}

    def serve(request: TraceRequest) -> RequestRecord:
        sent["all"].append(request)
        mine = sum(1 for r in sent["all"] if r.adapter == request.adapter)
        tier = "L3" if mine <= cold_first else "L0"
        failed = fail_every and tier == "L0" and mine % fail_every == 0
        tokens = request.output_tokens
        return RequestRecord(
            request.t_s, request.tenant, request.adapter, tier, 503 if failed else 200,
            0.04 + 0.001 * request.prompt_tokens, 0.01 if tokens > 1 else None, tokens,
            "r1", "busy" if failed else None,
        )  # fmt: skip

    async def send_one(url: str, request: TraceRequest, **_: Any) -> RequestRecord:
        return serve(request)

    async def replay(url: str, requests: list[Any], keys: dict[str, str], drive: Any) -> list:
        sent["paced"].append(list(requests))
        return [serve(r) for r in requests]

    monkeypatch.setattr(fleet_lone, "send_one", send_one)
    monkeypatch.setattr(contention_rounds, "send_one", send_one)
    monkeypatch.setattr(fleet_lone, "replay", replay)
    return sent


def _config(**fields: Any) -> FleetCalibrateConfig:
    """No idle gap between rounds (the stand-in does not care), one round per count."""
    return FleetCalibrateConfig(hop_gap_s=0.0, contention_rounds=1, **fields)


def test_warms_then_keeps_only_warm_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _fake_ingress(monkeypatch, cold_first=2)
    config = _config(requests=3, prefill_lengths=(8, 32), in_flight=(1, 2))
    samples, rounds, left_out, where = _measure(
        "http://x", "key", ADAPTERS, sizes=SIZES, config=config, drive=DRIVE
    )
    assert left_out == 0
    assert where == {"adapters": ["r8", "r64"], "placed_on": None, "replica_l0_counts": None}
    lone = 2 * (3 + 2 * 3 + 3)  # 3 warming (2 cold, 1 warm) + prefills + decodes
    per_client = contention_rounds.CONTENTION_PER_CLIENT
    assert len(sent["all"]) == lone + (1 + 2) * per_client
    prefills = [s for s in samples if s.tpot_s is None]
    decodes = [s for s in samples if s.tpot_s is not None]
    assert len(prefills) == 2 * 2 * 3 and len(decodes) == 2 * 3
    assert {(s.rank, s.nbytes) for s in samples} == {(8, 1000), (64, 8000)}
    assert {s.prompt_tokens for s in prefills} == {8, 32}
    assert [r.in_flight for r in rounds] == [1, 2]
    assert all(r.requests_per_s > 0 for r in rounds)
    assert [r.ttft_s for r in rounds] == [pytest.approx(0.056)] * 2  # the stand-in's TTFT


def test_failed_and_cold_requests_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ingress(monkeypatch, cold_first=7, fail_every=5)  # not warm within the 6 tries
    config = _config(requests=2, prefill_lengths=(8,))
    samples, _, left_out, _ = _measure(
        "http://x", "key", ADAPTERS[:1], sizes=SIZES, config=config, drive=DRIVE
    )
    # 6 warming tries (cold), then prefills 7 (cold) and 8, decodes 9 and 10 (failed)
    assert left_out == 2
    assert [(s.prompt_tokens, s.tpot_s is None) for s in samples] == [(8, True), (8, False)]


def test_the_lone_requests_are_paced_by_the_lone_servers_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fleet's lone requests are ``paced_requests``' trace (``hop_gap_s`` apart from the
    first, ``hop_output_tokens`` each; the decode ones ``output_tokens``), replayed as ``bench
    sim`` replays a fleet's trace; before, they went back to back with ``max_tokens`` 1."""
    assert fleet_lone.paced_requests is calibrate_run.paced_requests
    sent = _fake_ingress(monkeypatch, cold_first=0)
    config = FleetCalibrateConfig(
        requests=3, prefill_lengths=(8, 32), hop_gap_s=0.5, hop_output_tokens=5
    )
    samples, left_out = fleet_lone.lone_samples(
        "http://x", "k", ADAPTERS[0], 1000, config=config, drive=DRIVE
    )
    groups = sent["paced"]
    assert [[r.t_s for r in group] for group in groups] == [[0.5, 1.0, 1.5]] * 3
    assert [{(r.prompt_tokens, r.output_tokens) for r in group} for group in groups] == [
        {(8, 5)}, {(32, 5)}, {(8, config.output_tokens)},
    ]  # fmt: skip
    assert (len(samples), left_out) == (9, 0)


def test_contention_rounds_run_on_adapters_placed_one_per_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rounds' candidates are warmed after the lone samples, one at a time; each is kept
    only where it lands on a replica holding none yet (seen as that replica's GPU-slot count
    growing), else evicted; client i then sends to kept adapter i mod n."""
    sent = _fake_ingress(monkeypatch, cold_first=1)
    config = _config(requests=2, prefill_lengths=(8,), in_flight=(1, 4), replicas=3)
    pool = contention_rounds.candidates("t", config.num_contention_adapters)
    assert len(pool) == 3 * contention_rounds.CANDIDATES_PER_ADAPTER
    assert {(a.rank, a.targets) for a in pool} == {(8, ATTENTION_TARGETS)}
    # where the stand-in router puts each candidate: c1 collides with c0, c3 with c2
    lands = {"c0": 2, "c1": 2, "c2": 0, "c3": 0, "c4": 1}
    slots = [1, 0, 0]  # the lone adapter sits on replica 0
    evicted: list[str] = []

    def residency() -> list[int]:
        slots[:] = [1, 0, 0]
        kept = {n for n in lands if n not in evicted and any(r.adapter == n for r in sent["all"])}
        for name in kept:
            slots[lands[name]] += 1
        return list(slots)

    _, rounds, _, where = _measure(
        "http://x", "key", ADAPTERS[:1], sizes=SIZES, config=config, drive=DRIVE,
        rounds_pool=pool, residency=residency, evict=lambda a: evicted.append(a.name),
    )  # fmt: skip
    assert where == {
        "adapters": ["c0", "c2", "c4"], "placed_on": [2, 0, 1], "skipped": ["c1", "c3"],
        "per_replica": [1, 1, 1], "replica_l0_counts": [2, 1, 1],
    }  # fmt: skip
    assert evicted == ["c1", "c3"]
    names = [r.adapter for r in sent["all"]]
    first_round = names.index("c4") + 2  # each c warmed with 2 requests (1 cold, then L0)
    per_client = contention_rounds.CONTENTION_PER_CLIENT
    assert sorted(names[first_round:]) == sorted(
        ["c0"] * per_client + ["c0", "c2", "c4", "c0"] * per_client
    )
    assert [r.in_flight for r in rounds] == [1, 4]
    assert _config(replicas=2, contention_adapters=5).num_contention_adapters == 5
    assert _config(replicas=4).num_contention_adapters == 4


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"replicas": 1}, "replicas"),
        ({"contention_adapters": 0}, "contention_adapters"),
        ({"contention_adapters": 65}, "contention_adapters"),
        ({"output_tokens": 2}, "output_tokens"),
        ({"hop_gap_s": -1.0}, "hop_gap_s"),
        ({"hop_output_tokens": 0}, "hop_output_tokens"),
        ({"in_flight": (2, 4)}, "in_flight"),
        ({"in_flight": (1,)}, "in_flight"),
        ({"in_flight": (1, 100)}, "in_flight"),
        ({"contention_rounds": 0}, "contention_rounds"),
        ({"cold_requests": -1}, "cold_requests"),
        ({"cold_requests": 257}, "cold_requests"),
    ],
)
def test_config_refuses_bad_fields_by_name(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        FleetCalibrateConfig(**fields)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--in-flight", "2,4"], "in_flight"),
        (["--contention-rounds", "0"], "contention_rounds"),
        (["--contention-adapters", "0"], "contention_adapters"),
        (["--cold-requests", "-1"], "cold_requests"),
    ],
)
def test_calibrate_fleet_refuses_bad_contention_flags(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    """Refused before any fleet starts (no Ray needed)."""
    from typer.testing import CliRunner

    from loraplex.cli import app

    base = Path(__file__).resolve().parents[1] / "sim" / "cost_example.json"
    args = ["sim", "calibrate-fleet", "--base", str(base), "--out", str(tmp_path / "o.json")]
    result = CliRunner().invoke(app, [*args, *flags])
    assert result.exit_code != 0
    assert named in result.output
    assert not (tmp_path / "o.json").exists()


def test_measure_fleet_times_the_host_probe_around_the_deployment(
    monkeypatch: pytest.MonkeyPatch, demo_assets: Any
) -> None:
    """The probe runs in the cluster before the fleet is deployed and after it is deleted (Ray,
    the deployment and the requests stubbed; the registry is written for real)."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    from loraplex.bench.fleet import cluster
    from loraplex.bench.sim import calibrate_fleet, host_probe
    from loraplex.sim.host_speed import HostProbe

    events: list[str] = []

    @contextmanager
    def local_cluster(num_cpus: int) -> Iterator[int]:
        yield 1234

    @contextmanager
    def deployed(settings: Any, url: str, admin_key: str) -> Iterator[None]:
        events.append("deploy")
        yield
        events.append("delete")

    def measure(*_: Any, **__: Any) -> tuple[list, list, int, dict]:
        events.append("measure")
        return [], [], 0, {"adapters": []}

    def probe() -> HostProbe:
        events.append("probe")
        return HostProbe(matmul_s=0.3, loop_s=0.2)

    monkeypatch.setattr(cluster, "local_cluster", local_cluster)
    monkeypatch.setattr(cluster, "deployed", deployed)
    monkeypatch.setattr(calibrate_fleet, "_measure", measure)
    monkeypatch.setattr(host_probe, "host_probe", probe)
    asset_dir = demo_assets.base_model_dir.parents[2]  # <dir>/test-small/models/<model>
    *_, probes = calibrate_fleet.measure_fleet(_config(), asset_dir)
    assert events == ["probe", "deploy", "measure", "delete", "probe"]
    assert probes == [HostProbe(matmul_s=0.3, loop_s=0.2)] * 2


def test_cold_requests_come_last_one_lone_request_per_adapter_each_evicted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the rounds, one request (8 prompt tokens, 1 out) per cold adapter, never warmed;
    each evicted from the GPU slots right after its request; the ones the fleet loaded from the
    store are kept as cold samples (their rank and bytes), the one it found warm is not, and
    the warm requests' left-out count does not hold them."""
    sent = _fake_ingress(monkeypatch, cold_first=1)
    colds = cold_adapters(3)
    assert [(a.name, a.rank, a.targets) for a in colds] == [
        ("cold0-r8", 8, ATTENTION_TARGETS), ("cold1-r64", 64, ATTENTION_TARGETS),
        ("cold2-r8", 8, ATTENTION_TARGETS),
    ]  # fmt: skip
    sizes = {**SIZES, **{(a.tenant, a.name): 100 * a.rank for a in colds}}
    sent["all"].append(TraceRequest(0.0, "fleetcal", "cold2-r8", 8, 1))  # seen: found warm
    evicted: list[str] = []
    reads: list[int] = []

    def stages() -> dict[str, float]:  # the fleet's counters: each load 10 ms of fetch
        reads.append(len(reads))
        return {"fetch": 0.01 * len(reads)}

    config = _config(requests=2, prefill_lengths=(8,), in_flight=(1, 2))
    samples, rounds, left_out, _ = _measure(
        "http://x", "key", ADAPTERS[:1], sizes=sizes, config=config, drive=DRIVE,
        evict=lambda a: evicted.append(a.name), colds=colds, stages=stages,
    )  # fmt: skip
    last = sent["all"][-3:]
    assert [(r.adapter, r.prompt_tokens, r.output_tokens) for r in last] == [
        ("cold0-r8", 8, 1), ("cold1-r64", 8, 1), ("cold2-r8", 8, 1),
    ]  # fmt: skip
    assert [r.in_flight for r in rounds] == [1, 2]  # the rounds ran before them
    assert evicted == ["cold0-r8", "cold1-r64", "cold2-r8"]
    cold = [s for s in samples if s.cold]
    assert [(s.rank, s.nbytes, s.prompt_tokens, s.tpot_s) for s in cold] == [
        (8, 800, 8, None), (64, 6400, 8, None),
    ]  # fmt: skip
    assert samples[-2:] == cold and left_out == 0
    assert len(reads) == 1 + 3  # before the first, after each
    assert [s.load_stages_s for s in cold] == [pytest.approx((0.01, 0.0, 0.0))] * 2
    assert COLD_REQUESTS == 12 == FleetCalibrateConfig().cold_requests


def _calibrated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, samples: list, **fields: Any
) -> tuple[Any, dict[str, Any]]:
    """``calibrate_fleet`` over ``samples`` (the fleet, the placement replay and the fit by
    simulation stubbed): the model and the report."""
    from dataclasses import replace
    from types import SimpleNamespace

    from loraplex.bench.sim import calibrate_fleet
    from loraplex.sim.calibrate_fleet import ContentionSample
    from loraplex.sim.cost_model import load
    from loraplex.sim.host_speed import HostProbe

    base = load(Path(__file__).resolve().parents[1] / "sim" / "cost_example.json")
    base = replace(base, fleet_load_scale=9.0)  # a fleet file given as the base: not kept
    rounds = [ContentionSample(1, 10.0), ContentionSample(2, 15.0)]
    where = {"adapters": ["c0"], "placed_on": None}
    probes = [HostProbe(matmul_s=0.3, loop_s=0.2)] * 2
    measured = (samples, rounds, 0, where, probes)
    monkeypatch.setattr(calibrate_fleet, "checked_measurements", lambda *_: (measured, [[]]))
    placed = SimpleNamespace(adapters=[], replicas=[], skipped=[])
    monkeypatch.setattr(calibrate_fleet, "simulated_rounds", lambda *_, **__: (0, 0, placed))

    def fit(model: Any, config: Any, shape: Any, medians: Any, first: Any) -> Any:
        return SimpleNamespace(
            contention=first, iterations=0, measured={}, simulated_first={},
            simulated_fitted={}, worst_gap=0.0, simulated_ttft_s={},
        )  # fmt: skip

    monkeypatch.setattr(calibrate_fleet, "fit_by_simulation", fit)
    config = _config(**fields)
    return calibrate_fleet.calibrate_fleet(base, config, tmp_path, "loraplex sim calibrate-fleet")


def _lone(base_ttft: float = 0.03) -> list:
    from loraplex.sim.calibrate_fleet import FleetSample

    warm = [FleetSample(8, 8, 1000, base_ttft + 0.001 * i) for i in range(3)]
    return [*warm, FleetSample(8, 8, 1000, 0.02, 0.004)]


def _cold(ttft_s: float, scale: float | None, nbytes: int = 500_000) -> Any:
    """A cold sample whose load took ``scale`` times its links' price in the example file
    (None: no stage seconds read)."""
    from loraplex.sim.calibrate_fleet import LOAD_LINKS, FleetSample
    from loraplex.sim.cost_model import load

    links = load(Path(__file__).resolve().parents[1] / "sim" / "cost_example.json").links
    stages = None if scale is None else tuple(scale * links[k].seconds(nbytes) for k in LOAD_LINKS)
    return FleetSample(8, 8, nbytes, ttft_s, cold=True, load_stages_s=stages)


def test_calibrate_fleet_writes_the_load_scale_its_source_and_every_ratio(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cold samples' stage ratios go to the report in the order sent; their median is the
    file's ``fleet_load_scale``, its source saying how many were sent, kept and timed, their
    range and the per-link ratios; the TTFT-residual ratios (the fit before) stay beside them;
    a base file's own value is not kept."""
    from loraplex.sim.calibrate_fleet import ttft_load_ratios

    colds = [_cold(t, k) for t, k in ((0.09, 1.4), (0.05, 1.1), (0.07, 2.0), (0.2, 1.2))]
    colds.append(_cold(0.08, None))  # kept, its counters not read: not in the fit
    model, report = _calibrated(monkeypatch, tmp_path, _lone() + colds, cold_requests=6)
    cold = report["cold"]
    assert cold["ratios"] == pytest.approx([1.4, 1.1, 2.0, 1.2])
    assert cold["link_ratios"] == pytest.approx({"L3_to_L2": 1.3, "L2_to_L1": 1.3, "L1_to_L0": 1.3})
    assert cold["ttft_s"] == [0.09, 0.05, 0.07, 0.2, 0.08]
    assert cold["load_stages_s"][4] is None and len(cold["load_stages_s"][0]) == 3
    assert (cold["requests"], cold["kept"], cold["left_out"], cold["stage_timed"]) == (6, 5, 1, 4)
    assert model.fleet_load_scale == pytest.approx(1.3) == cold["fleet_load_scale"]
    assert cold["spread"]["min"] == pytest.approx(1.1) and cold["spread"]["max"] == 2.0
    assert cold["ttft_ratios"] == pytest.approx(ttft_load_ratios(model, colds))
    text = model.sources["fleet_load_scale"]
    assert "median over 4 lone cold requests" in text and "6 sent, 1 left out" in text
    assert "1 kept without stage seconds" in text and "stage counters" in text
    assert "ratios 1.100 to 2.000" in text and "L1_to_L0 1.300" in text
    assert [s["cold"] for s in report["samples"]][-5:] == [True] * 5


def test_calibrate_fleet_with_too_few_timed_loads_flags_it_and_keeps_no_scale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two timed loads (of three needed): no key, the source and the report saying why."""
    colds = [_cold(0.09, 1.4), _cold(0.05, 1.1), _cold(0.07, None)]
    model, report = _calibrated(monkeypatch, tmp_path, _lone() + colds, cold_requests=3)
    assert model.fleet_load_scale is None
    text = model.sources["fleet_load_scale"]
    assert "not fitted: 2 of 3 lone cold requests kept with their load's stage seconds" in text
    assert "3 needed" in text
    assert report["cold"]["fleet_load_scale"] is None and report["cold"]["ratios"] == []
    assert "too few samples: 2 cold requests" in report["cold"]["refused"]
    assert len(report["cold"]["ttft_ratios"]) == 3  # kept for comparison all the same


def test_calibrate_fleets_file_keeps_every_field_through_a_round_trip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The written file (the stage-fitted ``fleet_load_scale`` among the fleet keys) reads back
    to the same model, and writes the same JSON again, key by key."""
    import json

    from loraplex.sim.cost_model import from_dict, load

    colds = [_cold(0.09, k) for k in (1.4, 1.1, 2.0)]
    model, _ = _calibrated(monkeypatch, tmp_path, _lone() + colds, cold_requests=3)
    model.save(tmp_path / "fleet.json")
    again = load(tmp_path / "fleet.json")
    assert again == model and again.fleet_load_scale == pytest.approx(1.4)
    body = json.loads((tmp_path / "fleet.json").read_text())
    assert json.loads(again.to_json()) == body
    assert from_dict(body) == model
    for key in ("fleet_load_scale", "fleet_cpu_scale", "network_s", "fleet_contention", "cores"):
        assert key in body


def test_the_cold_requests_asked_for_are_none_or_enough_to_fit() -> None:
    for count in (1, 2, -1, 257):
        with pytest.raises(ValueError, match=f"cold_requests {count} is invalid"):
            FleetCalibrateConfig(cold_requests=count)
    assert FleetCalibrateConfig(cold_requests=0).cold_requests == 0
    assert FleetCalibrateConfig(cold_requests=3).cold_requests == 3


def test_calibrate_fleet_without_cold_requests_says_so_and_keeps_no_scale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model, report = _calibrated(monkeypatch, tmp_path, _lone(), cold_requests=0)
    assert model.fleet_load_scale is None
    assert "not measured (--cold-requests 0)" in model.sources["fleet_load_scale"]
    assert report["cold"]["ratios"] == [] and "spread" not in report["cold"]
    model, report = _calibrated(monkeypatch, tmp_path, _lone(), cold_requests=3)
    assert model.fleet_load_scale is None
    assert "not fitted: 0 of 3 lone cold requests" in model.sources["fleet_load_scale"]
