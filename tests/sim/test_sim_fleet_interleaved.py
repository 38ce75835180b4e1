"""``bench sim --calibrate-fleet-interleaved``: the fleet's lone terms fitted per pass, each
fleet trace priced from the passes around its runs, and the passes run around the fleet runs
(``bench/sim/fleet_interleaved.py``), on synthetic samples: no fleet, no Ray."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sim_inputs import cost

from loraplex.bench.serve.driver import DriveConfig
from loraplex.bench.sim import bench
from loraplex.bench.sim.config import SimBenchConfig
from loraplex.bench.sim.fleet_interleaved import (
    FleetPass,
    InterleavedFleet,
    fleet_pass_config,
    fleet_pricing,
    fleet_terms,
)
from loraplex.bench.sim.validate import RealSettings
from loraplex.bench.workloads import Workload
from loraplex.sim.calibrate_fleet import FleetSample
from loraplex.sim.cost_model import CostModel
from loraplex.sim.cpu import Contention
from loraplex.sim.host_speed import HostProbe

CURVE = Contention((1, 2, 4), (1.0, 1.4, 2.5))
NETWORK_S = 0.004  # the hop the synthetic samples carry at speed 1
PROBE = HostProbe(matmul_s=0.3, loop_s=0.2)


def _base() -> CostModel:
    return replace(cost(), fleet_contention=CURVE)


def _samples(base: CostModel, speed: float) -> tuple[FleetSample, ...]:
    """Lone fleet requests on a host ``speed`` times slower than the base's replica would be:
    every step and the hop stretched, the lone server's front and ipc not; two adapters, two
    prompt lengths, a little spread so the jitter has quantiles."""
    out = []
    for rank, nbytes in ((8, 1000), (64, 8000)):
        for prompt in (8, 32):
            for wobble in (-0.0005, 0.0, 0.0005):
                shape = FleetSample(prompt, rank, nbytes, 1.0)
                ttft = base.front_s + base.ipc_s + speed * (shape.prefill_price_s(base) + NETWORK_S)
                out.append(replace(shape, ttft_s=ttft + wobble))
        shape = FleetSample(8, rank, nbytes, 1.0)
        tpot = speed * shape.decode_price_s(base)
        out += [replace(shape, ttft_s=0.02, tpot_s=tpot * f) for f in (0.98, 1.0, 1.02)]
    return tuple(out)


def _calibration(speeds: list[float], probe_scale: float = 1.0) -> InterleavedFleet:
    base = _base()
    calibration = InterleavedFleet(3, base, cores=2)
    probe = HostProbe(PROBE.matmul_s * probe_scale, PROBE.loop_s * probe_scale)
    for i, speed in enumerate(speeds):
        calibration.passes.append(FleetPass(_samples(base, speed), 0, (probe, probe), f"t{i}"))
    return calibration


def test_a_pass_takes_a_fraction_of_calibrate_fleets_lone_requests() -> None:
    assert fleet_pass_config(1).requests == 8
    assert fleet_pass_config(3).requests == 3
    assert fleet_pass_config(4).requests == 2
    assert fleet_pass_config(100).requests == 2  # one request per group gives no spread
    with pytest.raises(ValueError, match="calibrate_fleet_interleaved 0 is invalid"):
        fleet_pass_config(0)


def test_the_lone_terms_are_refitted_and_the_files_curve_kept() -> None:
    base = _base()
    model = fleet_terms(base, _samples(base, 1.5), 2, "here")
    assert model.fleet_cpu_scale == pytest.approx(1.5)
    assert model.fleet_contention == CURVE
    assert model.cores == 2
    assert model.network_s == pytest.approx(1.5 * NETWORK_S, rel=0.05)
    assert (model.front_s, model.ipc_s, model.step) == (base.front_s, base.ipc_s, base.step)
    assert "here" in model.sources["fleet_cpu_scale"]
    with pytest.raises(ValueError, match="no fleet_contention"):
        fleet_terms(cost(), _samples(base, 1.0), 2, "here")


def test_each_fleet_trace_is_priced_by_the_passes_around_its_runs() -> None:
    """Three fleet runs between four passes, the host 1.3 times slower from the third pass on:
    the first trace keeps the fast terms, the last the slow ones, the middle lies between, and
    all passes' model is none of them; the runs' probes read against their passes'."""
    calibration = _calibration([1.0, 1.0, 1.3, 1.3])
    slow = HostProbe(PROBE.matmul_s * 1.3, PROBE.loop_s * 1.3)
    probes = {"a": [PROBE], "b": [PROBE], "c": [slow]}
    whole, models, report = fleet_pricing(calibration, ["a", "b", "c"], probes)
    scale = {n: models[n].fleet_cpu_scale for n in "abc"}
    assert scale["a"] == pytest.approx(1.0)
    assert scale["c"] == pytest.approx(1.3)
    assert scale["a"] < scale["b"] < scale["c"]
    assert scale["a"] < whole.fleet_cpu_scale < scale["c"]
    assert models["c"].network_s > models["a"].network_s
    assert report["adjacent"] == {"a": [0, 1], "b": [1, 2], "c": [2, 3]}
    assert report["host_probe_ratio"] == {"a": 1.0, "b": 1.0, "c": 1.3}
    figures = [p["fleet_cpu_scale"] for p in report["passes"]]
    assert figures == pytest.approx([1.0, 1.0, 1.3, 1.3])
    assert [p["started"] for p in report["passes"]] == ["t0", "t1", "t2", "t3"]
    assert report["requests_per_group"] == 3
    assert "passes [0, 1, 2, 3] of 4" in whole.sources["network_s"]


def test_a_trace_run_twice_is_priced_by_the_passes_around_both_runs() -> None:
    calibration = _calibration([1.0, 2.0, 2.0, 1.0, 1.0])
    _, models, report = fleet_pricing(calibration, ["a", "b", "b", "a"], {})
    assert report["adjacent"] == {"a": [0, 1, 3, 4], "b": [1, 2, 3]}
    assert report["host_probe_ratio"] == {"a": None, "b": None}  # no run probed
    assert models["a"].fleet_cpu_scale < models["b"].fleet_cpu_scale


def test_passes_must_surround_the_fleet_runs() -> None:
    calibration = _calibration([1.0, 1.0])
    with pytest.raises(ValueError, match="2 fleet passes for 2 fleet runs"):
        fleet_pricing(calibration, ["a", "b"], {})


def test_fleet_interleaving_needs_a_calibrate_fleet_file_and_the_fleet_target() -> None:
    with pytest.raises(ValueError, match="needs a cost model with fleet_contention"):
        InterleavedFleet(2, cost())
    with pytest.raises(ValueError, match="calibrate_fleet_interleaved 2 is invalid"):
        SimBenchConfig(calibrate_fleet_interleaved=2)  # no file: nothing to refit over
    with pytest.raises(ValueError, match="calibrate_fleet_interleaved 2 is invalid"):
        SimBenchConfig(
            cost_model=Path("c.json"), targets=("single",), calibrate_fleet_interleaved=2
        )
    with pytest.raises(ValueError, match="calibrate_fleet_interleaved -1 is invalid"):
        SimBenchConfig(calibrate_fleet_interleaved=-1)
    single = SimBenchConfig(targets=("single",), scale=None)
    with pytest.raises(ValueError, match="fleet passes need"):
        bench.run_sim_bench(single, _base(), None, InterleavedFleet(2, _base()))


class _Recording(InterleavedFleet):
    """Records when each pass would run instead of deploying a fleet."""

    def __init__(self, events: list[str]) -> None:
        super().__init__(2, _base())
        self.events = events

    def run_pass(self, target: Any, settings: RealSettings, drive: DriveConfig, root: Path) -> None:
        self.events.append("pass")


def test_a_pass_runs_before_each_fleet_run_and_after_the_last(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from loraplex.bench.fleet import cluster
    from loraplex.bench.sim import host_probe, validate

    events: list[str] = []

    @contextmanager
    def local_cluster(num_cpus: int) -> Iterator[int]:
        yield 1234

    def fleet_outcome(target: Any, workload: Workload, *_: Any, **__: Any) -> dict[str, Any]:
        events.append(f"run {workload.name}")
        return {}

    monkeypatch.setattr(cluster, "local_cluster", local_cluster)
    monkeypatch.setattr(validate, "fleet_outcome", fleet_outcome)
    monkeypatch.setattr(host_probe, "host_probe", lambda: PROBE)
    config = SimBenchConfig(
        traces=("zipf-longtail", "hot-burst"), targets=("fleet",), repeats=2, scale=None,
        trace_requests=8,
    )  # fmt: skip
    order: list[tuple[str, str]] = []
    registry: Any = None
    bench.real(
        config, config.workloads(), registry, tmp_path, 100, run_order=order,
        fleet_passes=_Recording(events),
    )  # fmt: skip
    runs = ["run zipf-longtail", "run hot-burst", "run hot-burst", "run zipf-longtail"]
    assert events == [e for r in runs for e in ("pass", r)] + ["pass"]
    assert [n for _, n in order] == [r.removeprefix("run ") for r in runs]


def _stub_pass(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """A pass's deployment, requests and probes stubbed, each recorded in ``events``."""
    from loraplex.bench.fleet import cluster
    from loraplex.bench.sim import fleet_lone, host_probe

    @contextmanager
    def deployed(settings: Any, url: str, admin_key: str) -> Iterator[None]:
        events.append("deploy")
        yield
        events.append("delete")

    def warm_up(url: str, key: str, adapter: Any, **_: Any) -> bool:
        events.append(f"warm {adapter.name}")
        return True

    def lone_samples(url: str, key: str, adapter: Any, nbytes: int, **_: Any) -> tuple:
        events.append(f"lone {adapter.name}")
        return [FleetSample(8, adapter.rank, nbytes, 0.02, 0.003)], 1

    def cold_samples(url: str, key: str, adapters: list, **kwargs: Any) -> tuple:
        events.append("cold " + ",".join(a.name for a, _ in adapters))
        assert kwargs["evict"] is not None  # each cold adapter dropped from the slots after
        assert kwargs["stages"] is not None  # the fleet's stage counters read around each
        return [FleetSample(8, 8, adapters[0][1], 0.05, cold=True)], len(adapters) - 1

    def probe() -> HostProbe:
        events.append("probe")
        return PROBE

    monkeypatch.setattr(cluster, "deployed", deployed)
    monkeypatch.setattr(fleet_lone, "warm_up", warm_up)
    monkeypatch.setattr(fleet_lone, "lone_samples", lone_samples)
    monkeypatch.setattr(fleet_lone, "cold_samples", cold_samples)
    monkeypatch.setattr(host_probe, "host_probe", probe)


DRIVE = DriveConfig(request_timeout_s=5.0, vocab_size=100)


def test_a_pass_measures_on_its_own_deployment_and_keeps_its_samples(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, demo_assets: Any
) -> None:
    """One pass with the deployment and the requests stubbed (the registry written for real):
    probes around the deployment, both lone adapters warmed and sampled, the samples kept in
    ``logs_dir``, a second pass reusing the registry."""
    import json

    from loraplex.bench.serve.fleet import Fleet

    events: list[str] = []
    _stub_pass(monkeypatch, events)
    traces = Fleet(tmp_path / "traces", demo_assets.base_model_dir, {}, "admin", 64)
    logs = tmp_path / "logs"
    logs.mkdir()
    calibration = InterleavedFleet(4, _base(), logs)
    for _ in range(2):
        calibration.run_pass((traces, "http://x", 1), RealSettings(), DRIVE, tmp_path)
    cold = "cold cold0-r8,cold1-r64,cold2-r8,cold3-r64"  # after the warm ones, in no replica
    one = ["probe", "deploy", "warm r8", "lone r8", "warm r64", "lone r64", cold, "delete"]
    assert events == [*one, "probe", *one, "probe"]
    assert [(len(p.samples), p.left_out) for p in calibration.passes] == [(3, 5), (3, 5)]
    kept = json.loads((logs / "fleet-calibration-p1.samples.json").read_text())
    assert kept["left_out"] == 5
    assert [(s["rank"], s["cold"]) for s in kept["samples"]] == [(8, False), (64, False), (8, True)]
    assert kept["probes"] == [{"matmul_s": 0.3, "loop_s": 0.2}] * 2


@pytest.mark.parametrize(
    ("count", "cold"),
    [(6, ["cold cold0-r8,cold1-r64,cold2-r8,cold3-r64,cold4-r8,cold5-r64"]), (0, [])],
)
def test_a_pass_sends_the_cold_requests_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, demo_assets: Any, count: int, cold: list
) -> None:
    """``--calibrate-fleet-cold-requests N``: N cold adapters of their own per pass (ranks 8
    and 64 in turn, registered with the pass's fleet); 0: none sent."""
    from loraplex.bench.serve.fleet import Fleet

    events: list[str] = []
    _stub_pass(monkeypatch, events)
    traces = Fleet(tmp_path / "traces", demo_assets.base_model_dir, {}, "admin", 64)
    calibration = InterleavedFleet(4, _base(), cold_requests=count)
    calibration.run_pass((traces, "http://x", 1), RealSettings(), DRIVE, tmp_path)
    assert [e for e in events if e.startswith("cold")] == cold
    assert len([s for s in calibration.passes[0].samples if s.cold]) == (1 if count else 0)
    with pytest.raises(ValueError, match="cold_requests -1 is invalid"):
        InterleavedFleet(4, _base(), cold_requests=-1)


def _cold(model: Any, scale: float | None, nbytes: int = 500_000) -> FleetSample:
    """A cold sample whose load took ``scale`` times its links' price (None: not timed)."""
    from loraplex.sim.calibrate_fleet import LOAD_LINKS

    links = model.links
    stages = None if scale is None else tuple(scale * links[k].seconds(nbytes) for k in LOAD_LINKS)
    return FleetSample(8, 8, nbytes, 0.08, cold=True, load_stages_s=stages)


def test_the_passes_load_scale_replaces_the_files_and_says_so() -> None:
    """The passes' timed cold requests, three or more, replace a ``sim calibrate-fleet`` file's
    ``fleet_load_scale`` (measured at the runs' time, like the other lone terms), the source
    naming the file's value; a pass set without a cold sample leaves the file's value and
    source as they were; with too few timed ones the value stays and its source says so."""
    base = _base()
    base = replace(
        base, fleet_load_scale=2.0, sources={**base.sources, "fleet_load_scale": "the file's"}
    )
    warm = _samples(base, 1.0)
    kept = fleet_terms(base, warm, 2, "here")
    assert (kept.fleet_load_scale, kept.sources["fleet_load_scale"]) == (2.0, "the file's")
    colds = (_cold(base, 1.2), _cold(base, 1.5), _cold(base, 1.3), _cold(base, None))
    measured = fleet_terms(base, warm + colds, 2, "here")
    assert measured.fleet_load_scale == pytest.approx(1.3)
    text = measured.sources["fleet_load_scale"]
    assert "replaces the file's 2" in text and "median over 3 lone cold requests" in text
    assert "1 more kept without stage seconds" in text
    plain = fleet_terms(replace(base, fleet_load_scale=None), warm + colds, 2, "here")
    assert "the file had none" in plain.sources["fleet_load_scale"]
    few = fleet_terms(base, warm + colds[:2], 2, "here")
    assert few.fleet_load_scale == 2.0
    text = few.sources["fleet_load_scale"]
    assert text.startswith("the file's; not refitted by the fleet passes (here)")
    assert "too few samples: 2 cold requests" in text


def test_the_pass_report_keeps_each_passes_own_cold_ratios() -> None:
    """Each pass's own ``fleet_load_scale`` (None where it kept too few timed cold requests:
    the file's value is not reported as the pass's), every timed cold request's stage ratio and
    every cold request's TTFT ratio (the fit before)."""
    calibration = _calibration([1.0, 1.0])
    calibration.base = replace(calibration.base, fleet_load_scale=2.0)
    base = calibration.base
    colds = (_cold(base, 1.1), _cold(base, 1.6), _cold(base, 1.4), _cold(base, None))
    first = calibration.passes[0]
    calibration.passes[0] = replace(first, samples=first.samples + colds)
    second = calibration.passes[1]
    calibration.passes[1] = replace(second, samples=second.samples + colds[:1])
    report = calibration.pass_report()
    assert report[0]["cold_ratios"] == pytest.approx([1.1, 1.6, 1.4])
    assert report[0]["fleet_load_scale"] == pytest.approx(1.4)
    assert len(report[0]["cold_ttft_ratios"]) == 4
    assert report[1]["fleet_load_scale"] is None  # one timed: too few for its own
    assert report[1]["cold_ratios"] == pytest.approx([1.1])


def test_the_cold_requests_per_pass_need_the_fleet_passes() -> None:
    with pytest.raises(ValueError, match="calibrate_fleet_cold_requests 3 is invalid"):
        SimBenchConfig(calibrate_fleet_cold_requests=3)
    for count in (-1, 1, 2, 257):
        with pytest.raises(ValueError, match=f"calibrate_fleet_cold_requests {count} is invalid"):
            SimBenchConfig(
                cost_model=Path("c.json"), calibrate_fleet_interleaved=2,
                calibrate_fleet_cold_requests=count,
            )  # fmt: skip
    with pytest.raises(ValueError, match="cold_requests 2 is invalid"):
        InterleavedFleet(4, _base(), cold_requests=2)
    config = SimBenchConfig(
        cost_model=Path("c.json"), calibrate_fleet_interleaved=2, calibrate_fleet_cold_requests=0
    )
    assert config.calibrate_fleet_cold_requests == 0
