"""``step.per_prefill_step_s``: once per step that holds prompt tokens, fitted on the engine's own
timeline of lone prefill steps (the measuring side: tests/bench/test_sim_calibrate_timeline.py)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from sim_inputs import calibration_measured, cost, scenario

from loraplex.sim.calibrate import (
    LoadSample,
    StepSample,
    calibrated_model,
    fit_step,
    median_hop_s,
)
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import LINKS, CostModel, StepCost, from_dict, load
from loraplex.sim.profiles import uncited
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

X = 0.003  # the per-prefill-step price the simulations below charge


def _priced(x: float = X) -> CostModel:
    return replace(cost(), step=replace(cost().step, per_prefill_step_s=x))


def test_the_term_is_charged_once_on_a_step_holding_prompt_tokens() -> None:
    plain = StepCost(0.002, 1e-4, 3e-4, 1e-7, per_prefill_token_s=2e-5)
    step = replace(plain, per_prefill_step_s=X)
    assert step.seconds(4, 0, 2, 32) == plain.seconds(4, 0, 2, 32)  # decode only: nothing
    assert step.seconds(0, 16, 1, 128) - plain.seconds(0, 16, 1, 128) == pytest.approx(X)
    # three prompts and four decodes in one step: once, not per prompt or per token
    assert step.seconds(4, 48, 2, 416) - plain.seconds(4, 48, 2, 416) == pytest.approx(X)
    weighted = replace(step, per_byte_token_s=1e-12)
    extra = weighted.seconds(0, 16, 1, 128, byte_tokens=10**6) - step.seconds(0, 16, 1, 128)
    assert extra == pytest.approx(1e-6)  # the other terms as before


def test_the_key_round_trips_and_a_file_without_it_reads_and_writes_as_before(
    tmp_path: Path,
) -> None:
    model = _priced()
    model.save(tmp_path / "p.json")
    assert load(tmp_path / "p.json") == model
    assert json.loads(model.to_json())["step"]["per_prefill_step_s"] == X
    body = json.loads(cost().to_json())
    assert "per_prefill_step_s" not in body["step"]
    old = from_dict(body)
    assert old.step.per_prefill_step_s is None
    old.save(tmp_path / "old.json")
    assert json.loads((tmp_path / "old.json").read_text())["step"] == body["step"]


@pytest.mark.parametrize("value", [None, -0.001, "3ms", True, float("nan"), float("inf")])
def test_a_malformed_term_is_refused_by_name(value: object) -> None:
    body = json.loads(cost().to_json())
    body["step"]["per_prefill_step_s"] = value
    with pytest.raises(ValueError, match="per_prefill_step_s"):
        from_dict(body)


def test_a_profile_that_sets_the_term_must_cite_it() -> None:
    model = replace(_priced(), sources={"*": "x"})
    assert "step.per_prefill_step_s" in uncited(model)
    assert "step.per_prefill_step_s" not in uncited(replace(model, step=cost().step))


@pytest.mark.parametrize("replicas", [1, 3])
def test_files_without_the_key_simulate_byte_identically(replicas: int) -> None:
    """A file without the key, reread from its own JSON, and one with a term of 0 give the same
    bytes (test_sim_speed holds the recorded digests of files without it); the term moves them."""
    trace, config = scenario("hot-burst", duration_s=5), SimConfig(replicas=replicas)
    before = simulate(trace, config, cost()).to_json()
    reread = from_dict(json.loads(cost().to_json()))
    assert simulate(trace, config, reread).to_json() == before
    assert simulate(trace, config, _priced(0.0)).to_json() == before
    assert simulate(trace, config, _priced()).to_json() != before


def _metrics(trace: list[TraceRecord], model: CostModel, **kw: int) -> dict:  # type: ignore[type-arg]
    return simulate(trace, SimConfig(**kw), model).metrics


def test_a_warm_request_pays_it_once_and_its_decode_steps_never() -> None:
    trace = [TraceRecord(0.0, "t", "a", 16, 8), TraceRecord(5.0, "t", "a", 16, 8)]
    plain, priced = _metrics(trace, cost()), _metrics(trace, _priced())
    shift_ms = priced["ttft_ms_warm"]["p50"] - plain["ttft_ms_warm"]["p50"]
    assert shift_ms == pytest.approx(X * 1000, abs=2e-3)
    # the last request's end: its one prefill step pays X, its 7 decode steps nothing
    assert priced["makespan_s"] - plain["makespan_s"] == pytest.approx(X, abs=2e-6)


def test_a_chunked_prompt_pays_it_on_every_chunk() -> None:
    trace = [TraceRecord(0.0, "t", None, 1200, 2)]  # 512 + 512 + 176 tokens: three steps
    plain = _metrics(trace, cost(), max_num_batched_tokens=512, max_model_len=2048)
    priced = _metrics(trace, _priced(), max_num_batched_tokens=512, max_model_len=2048)
    shift_ms = priced["ttft_ms"]["p50"] - plain["ttft_ms"]["p50"]
    assert shift_ms == pytest.approx(3 * X * 1000, abs=2e-3)


def test_a_prefill_joining_a_decode_batch_delays_the_decoding_request() -> None:
    """What the flat hop cannot do: a prompt that joins a running batch makes that step, and so
    the request decoding in it, X longer."""
    long = TraceRecord(0.0, "t", None, 16, 64)
    joining = TraceRecord(0.1, "t", None, 16, 1)  # joins while ``long`` decodes
    alone = _metrics([long], _priced())["makespan_s"] - _metrics([long], cost())["makespan_s"]
    assert alone == pytest.approx(X, abs=2e-6)
    both = [long, joining]
    shifted = _metrics(both, _priced())["makespan_s"] - _metrics(both, cost())["makespan_s"]
    assert _metrics(both, cost())["makespan_s"] > 0.2  # ``long`` ends last, after the join
    assert shifted == pytest.approx(2 * X, abs=2e-6)


# --- the fit ---------------------------------------------------------------------------------

TRUE = StepCost(
    step_fixed_s=0.0026,
    per_token_s=3e-4,
    per_revision_s=1e-4,
    per_rank_token_s=4e-7,
    per_prefill_token_s=8e-5,
    per_prefill_step_s=0.0029,
)
TRUE_HOP_S = 0.0095


def _timeline(noise: float = 0.0, seed: int = 0) -> list[StepSample]:
    """Decode mixes (tokens x revisions x ranks) and lone prefill steps as the engine's timeline
    times them (no hop), priced by TRUE with relative noise."""
    rng = random.Random(seed)
    out = []
    for tokens in (1, 2, 4, 8):
        for revisions in (1, 2, 4):
            for rank in (8, 64):
                exact = TRUE.seconds(tokens, 0, revisions, tokens * rank)
                out.append(StepSample(tokens, 0, revisions, tokens * rank, exact))
    for length in (8, 16, 32, 64):
        for rank in (8, 64):
            exact = TRUE.seconds(0, length, 1, length * rank)
            out.append(StepSample(0, length, 1, length * rank, exact))
    return [replace(s, step_s=s.step_s * (1 + rng.gauss(0, noise))) for s in out]


def test_the_fit_on_engine_timed_prefills_recovers_the_prefill_step_term() -> None:
    fitted = fit_step(_timeline())
    assert fitted.ipc_s is None  # the timed steps hold no hop
    for name in ("step_fixed_s", "per_token_s", "per_prefill_token_s", "per_prefill_step_s"):
        assert getattr(fitted.step, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert fitted.fit.r_squared == pytest.approx(1.0)
    noisy = fit_step(_timeline(noise=0.01, seed=4)).step
    assert noisy.per_prefill_step_s == pytest.approx(TRUE.per_prefill_step_s, rel=0.15)
    assert noisy.step_fixed_s == pytest.approx(TRUE.step_fixed_s, rel=0.15)


def test_a_ttft_fit_has_no_prefill_step_term_and_kinds_do_not_mix() -> None:
    ttft = [
        replace(s, step_s=s.step_s + TRUE_HOP_S, hop=True) if s.prefill_tokens else s
        for s in _timeline()
    ]
    old = fit_step(ttft)
    assert old.step.per_prefill_step_s is None
    # the TTFT fit puts the prefill-step price into the hop: the two are one column there
    assert old.ipc_s == pytest.approx(TRUE_HOP_S + TRUE.per_prefill_step_s, rel=1e-6)
    with pytest.raises(ValueError, match="not both"):
        fit_step(_timeline() + ttft[-2:])
    with pytest.raises(ValueError, match="prefill"):
        fit_step([s for s in _timeline() if not s.prefill_tokens])


def _lone() -> list[tuple[StepSample, float]]:
    """8 lone requests per prefill shape: TTFT less front_s = the true step + the true hop."""
    shapes = [s for s in _timeline() if s.prefill_tokens]
    return [(replace(s, hop=True), s.step_s + TRUE_HOP_S) for s in shapes for _ in range(8)]


def test_the_calibrated_hop_loses_the_prefill_remainder() -> None:
    """On the same requests: the TTFT-based fit's hop holds the prefill step's remainder; the
    timeline fit's hop is the true one, and a lone request's TTFT is the same under both."""
    loads = [LoadSample(link, n, 0.001 + n / 1e9) for link in LINKS for n in (1000, 9000)]
    overheads = {"front_s": 0.0017, "network_s": 0.0}
    timed = calibrated_model("hw", _timeline(), loads, overheads, {}, lone_hops=_lone())
    assert timed.ipc_s == pytest.approx(TRUE_HOP_S, abs=1e-9)
    assert timed.step.per_prefill_step_s == pytest.approx(TRUE.per_prefill_step_s, rel=1e-6)
    ttft_steps = [replace(s, step_s=t, hop=True) for s, t in _lone()[::8]]
    ttft_steps += [s for s in _timeline() if not s.prefill_tokens]
    old = calibrated_model("hw", ttft_steps, loads, overheads, {}, lone_hops=_lone())
    assert old.ipc_s - timed.ipc_s == pytest.approx(TRUE.per_prefill_step_s, rel=1e-3)
    shape, measured_s = _lone()[0]
    for model in (timed, old):  # a lone request costs what it measured under both
        priced = model.step.seconds(0, shape.prefill_tokens, 1, shape.rank_tokens)
        assert model.ipc_s + priced == pytest.approx(measured_s, rel=1e-6)
    with pytest.raises(ValueError, match="lone_hops"):
        calibrated_model("hw", _timeline(), loads, overheads, {})


def test_a_calibration_with_timelines_fits_the_prefill_step_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``calibrate`` (bench/sim/calibration.py) on engine-timed prefill samples: the model has
    ``per_prefill_step_s``, ``ipc_s`` is the lone requests' median beyond it, the sources and
    the report say how, and the report keeps the TTFT-based samples and every timed step."""
    from loraplex.bench.sim import calibration
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
    from loraplex.bench.sim.calibrate_timeline import PrefillTiming, timed_samples

    low = ServedAdapter("calibration", "r8", "v1", 8)
    high = ServedAdapter("calibration", "r64", "v1", 64)
    measured = calibration_measured()
    ttft = [s for s in measured["steps"] if s.hop]
    decodes = [s for s in measured["steps"] if not s.hop]

    # The engine's prefill steps: the decode line's 2 ms + 0.3 ms per revision, the prompt's
    # tokens as the TTFT samples price them (their 4 ms constant off), and 3 ms of prompt path;
    # each lone request's TTFT less front_s adds a 2 ms hop.
    def engine_s(s: StepSample) -> float:
        return s.step_s - 0.004 + 0.002 + 3e-4 + 0.003

    timings = [
        PrefillTiming(low if s.rank_tokens == 8 * s.prefill_tokens else high, s.prefill_tokens,
                      (engine_s(s),) * 3)
        for s in ttft
    ]  # fmt: skip
    timed = timed_samples(timings, {low: (0, 0.0), high: (0, 0.0)})
    lone = [(s, engine_s(s) + 0.002) for s in ttft for _ in range(8)]
    steps = decodes + timed
    measured.update(
        steps=steps, step_fit=fit_step(steps), ttft_prefills=ttft, timings=timings,
        timed=timed, lone=lone, cold=[], residuals=[],
    )  # fmt: skip
    monkeypatch.setattr(calibration, "measure", lambda target, config: dict(measured))
    target = Target("http://x", "k", (low, high), {}, 100)
    model, report = calibration.calibrate(target, CalibrateConfig(), "hw", "cmd")
    assert model.step.per_prefill_step_s == pytest.approx(0.003, rel=1e-6)
    assert model.ipc_s == pytest.approx(0.002, abs=1e-9)
    assert model.ipc_s == pytest.approx(median_hop_s(lone, model.step))
    assert "first engine step" in model.sources["step"]
    assert "per_prefill_step_s" in model.sources["step"]
    assert "hold no hop" in model.sources["ipc_s"]
    assert f"{len(decodes)} controlled decode mixes" in model.sources["step"]
    assert len(report["ttft_prefill_samples"]) == len(ttft)
    assert report["prefill_timeline"][0]["steps_s"] == list(timings[0].steps_s)
    assert report["prefill_timeline"][0]["adapter"] == timings[0].adapter.ref
    assert report["prefill_timeline"][0]["sample"]["prefill_tokens"] == timed[0].prefill_tokens
