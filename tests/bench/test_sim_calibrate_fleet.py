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
    config = _config(requests=2, prefill_lengths=(8,), in_flight=(1, 2))
    samples, rounds, left_out, _ = _measure(
        "http://x", "key", ADAPTERS[:1], sizes=sizes, config=config, drive=DRIVE,
        evict=lambda a: evicted.append(a.name), colds=colds,
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


def test_calibrate_fleet_writes_the_load_scale_its_source_and_every_ratio(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cold samples' ratios (``load_scale_ratios`` over the fitted fleet terms) go to the
    report in the order sent; their median is the file's ``fleet_load_scale``, its source
    saying how many were sent and kept and their range; a base file's own value is not kept."""
    from loraplex.sim.calibrate_fleet import FleetSample, load_scale_ratios

    colds = [FleetSample(8, 8, 500_000, t, cold=True) for t in (0.09, 0.05, 0.07, 0.2)]
    model, report = _calibrated(monkeypatch, tmp_path, _lone() + colds, cold_requests=5)
    ratios = load_scale_ratios(model, colds)
    assert len(set(ratios)) == 4
    cold = report["cold"]
    assert cold["ratios"] == pytest.approx(ratios)
    assert cold["ttft_s"] == [0.09, 0.05, 0.07, 0.2]
    assert (cold["requests"], cold["kept"], cold["left_out"]) == (5, 4, 1)
    median = (sorted(ratios)[1] + sorted(ratios)[2]) / 2
    assert model.fleet_load_scale == pytest.approx(median) == cold["fleet_load_scale"]
    assert cold["spread"]["min"] == min(ratios) and cold["spread"]["max"] == max(ratios)
    text = model.sources["fleet_load_scale"]
    assert "median over 4 lone cold requests" in text and "5 sent, 1 left out" in text
    assert f"{min(ratios):.3f} to {max(ratios):.3f}" in text
    assert [s["cold"] for s in report["samples"]][-4:] == [True] * 4


def test_calibrate_fleet_without_cold_requests_says_so_and_keeps_no_scale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model, report = _calibrated(monkeypatch, tmp_path, _lone(), cold_requests=0)
    assert model.fleet_load_scale is None
    assert "not measured (--cold-requests 0)" in model.sources["fleet_load_scale"]
    assert report["cold"]["ratios"] == [] and "spread" not in report["cold"]
    model, report = _calibrated(monkeypatch, tmp_path, _lone(), cold_requests=3)
    assert model.fleet_load_scale is None
    assert "none of 3 lone cold requests was kept" in model.sources["fleet_load_scale"]
