import random
import statistics
from dataclasses import replace

import pytest

from loraplex.sim.calibrate import (
    LoadSample,
    StepSample,
    calibrated_model,
    fit_link,
    fit_step,
    least_squares,
)
from loraplex.sim.cost_model import LINKS, CostModel, StepCost

TRUE_STEP = StepCost(
    step_fixed_s=0.004,
    per_token_s=2.5e-5,
    per_revision_s=3e-4,
    per_rank_token_s=4e-7,
    per_prefill_token_s=6e-6,
)
TRUE_IPC_S = 0.003
TERMS = ("step_fixed_s", "per_token_s", "per_prefill_token_s", "per_revision_s", "per_rank_token_s")


def _steps(noise: float, seed: int = 0) -> list[StepSample]:
    """What a calibration measures, timed by the true model with noise: decode mixes (tokens x
    revisions x ranks) and lone prefills (prompt lengths x ranks) that include the hop."""
    rng = random.Random(seed)
    out = []
    for tokens in (1, 4, 16, 32):
        for revisions in (1, 2, 4):
            for rank in (8, 64):
                exact = TRUE_STEP.seconds(tokens, 0, revisions, tokens * rank)
                noisy = exact * (1 + rng.gauss(0, noise))
                out.append(StepSample(tokens, 0, revisions, tokens * rank, noisy))
    for length in (8, 16, 32, 64):
        for rank in (8, 64):
            exact = TRUE_IPC_S + TRUE_STEP.seconds(0, length, 1, length * rank)
            noisy = exact * (1 + rng.gauss(0, noise))
            out.append(StepSample(0, length, 1, length * rank, noisy, hop=True))
    return out


def test_fit_step_recovers_known_coefficients_exactly() -> None:
    fitted = fit_step(_steps(noise=0.0))
    for name in TERMS:
        assert getattr(fitted.step, name) == pytest.approx(getattr(TRUE_STEP, name), rel=1e-6)
    assert fitted.ipc_s == pytest.approx(TRUE_IPC_S, rel=1e-6)
    assert fitted.fit.r_squared == pytest.approx(1.0)
    assert fitted.fit.max_rel_residual < 1e-9


def test_fit_step_recovers_coefficients_under_noise() -> None:
    fitted = fit_step(_steps(noise=0.01, seed=3))
    step = fitted.step
    assert step.step_fixed_s == pytest.approx(TRUE_STEP.step_fixed_s, rel=0.1)
    assert step.per_token_s == pytest.approx(TRUE_STEP.per_token_s, rel=0.15)
    assert step.per_prefill_token_s == pytest.approx(TRUE_STEP.per_prefill_token_s, rel=0.25)
    assert step.per_rank_token_s == pytest.approx(TRUE_STEP.per_rank_token_s, rel=0.1)
    assert fitted.ipc_s == pytest.approx(TRUE_IPC_S, rel=0.25)
    assert fitted.fit.r_squared is not None and fitted.fit.r_squared > 0.99


def test_a_decode_only_fit_would_over_price_prefill() -> None:
    """Why the prefill samples exist: a prompt token here costs a quarter of a decode token,
    which a line through decode batches alone cannot know."""
    fitted = fit_step(_steps(noise=0.0))
    assert fitted.step.per_prefill_token_s is not None
    assert fitted.step.per_prefill_token_s < fitted.step.per_token_s / 4


def test_a_coefficient_driven_negative_is_dropped_not_kept() -> None:
    # y = 1 + 2x exactly, plus a regressor z whose unconstrained coefficient comes out < 0.
    rows = [(1.0, float(x), float(z)) for x, z in ((0, 0), (1, 1), (2, 0), (3, 1), (4, 2))]
    ys = [1 + 2 * x - 0.5 * z for _, x, z in rows]
    fit = least_squares(rows, ys)
    assert all(c >= 0 for c in fit.coefficients)
    assert fit.coefficients[2] == 0.0


def test_fit_step_refuses_samples_that_do_not_vary_every_term() -> None:
    samples = _steps(0.0)
    with pytest.raises(ValueError, match="do not determine"):  # rank-tokens follow decode
        fit_step([replace(s, rank_tokens=8 * s.decode_tokens) for s in samples])
    with pytest.raises(ValueError, match=">= 6 samples"):
        fit_step(samples[:5])
    with pytest.raises(ValueError, match="prefill"):
        fit_step([s for s in samples if not s.hop])  # decode mixes alone: prefill extrapolated
    with pytest.raises(ValueError, match="decode"):
        fit_step([s for s in samples if s.hop])


def test_fit_link_recovers_fixed_cost_and_bandwidth() -> None:
    samples = [LoadSample("L2_to_L1", n, 0.002 + n / 5e8) for n in (1 << 20, 4 << 20, 16 << 20)]
    link, fit = fit_link(samples)
    assert link.fixed_s == pytest.approx(0.002, rel=1e-6)
    assert link.bytes_per_s == pytest.approx(5e8, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0)


def test_fit_link_with_flat_times_bounds_the_bandwidth_by_the_samples() -> None:
    samples = [LoadSample("L1_to_L0", n, 0.001) for n in (1000, 2000)]
    link, _ = fit_link(samples)
    assert link.fixed_s == pytest.approx(0.001)
    assert link.bytes_per_s == pytest.approx(2000 / 0.001)


def test_fit_link_refuses_one_size_or_mixed_links() -> None:
    with pytest.raises(ValueError, match="distinct sizes"):
        fit_link([LoadSample("L1_to_L0", 10, 0.1), LoadSample("L1_to_L0", 10, 0.2)])
    with pytest.raises(ValueError, match="one link"):
        fit_link([LoadSample("L1_to_L0", 10, 0.1), LoadSample("L2_to_L1", 20, 0.2)])


def test_samples_validate_their_fields() -> None:
    with pytest.raises(ValueError, match="link"):
        LoadSample("L0_to_L9", 10, 0.1)
    with pytest.raises(ValueError, match="step_s"):
        StepSample(1, 0, 1, 8, 0.0)
    with pytest.raises(ValueError, match="decode_tokens"):
        StepSample(-1, 0, 1, 8, 0.1)
    with pytest.raises(ValueError, match="prefill_tokens"):
        StepSample(0, -1, 1, 8, 0.1, hop=True)


def test_calibrated_model_is_validated_and_cites_its_run() -> None:
    loads = [
        LoadSample(link, n, 0.001 * (i + 1) + n / 1e9)
        for i, link in enumerate(LINKS)
        for n in (1 << 20, 8 << 20)
    ]
    model = calibrated_model(
        "cpu-test", _steps(0.0), loads, {"front_s": 0.001}, {"command": "loraplex sim calibrate"}
    )
    assert model.validated and model.front_s == 0.001
    assert model.ipc_s == pytest.approx(TRUE_IPC_S, rel=1e-6)  # fitted with the step
    assert model.step.per_prefill_token_s == pytest.approx(6e-6, rel=1e-6)
    assert model.links["L1_to_L0"].fixed_s == pytest.approx(0.003)  # third of LINKS
    assert model.load_cpu_shared is False
    sources = {"command": "c"}
    shared = calibrated_model("x", _steps(0.0), loads, {}, sources, load_cpu_shared=True)
    assert shared.load_cpu_shared is True
    with pytest.raises(ValueError, match="no load samples"):
        calibrated_model("x", _steps(0.0), loads[:2], {}, {"command": "c"})
    with pytest.raises(ValueError, match="unknown keys"):
        calibrated_model("x", _steps(0.0), loads, {"gpu_s": 1.0}, {"command": "c"})
    with pytest.raises(ValueError, match="ipc_s is fitted"):
        calibrated_model("x", _steps(0.0), loads, {"ipc_s": 1.0}, {"command": "c"})


TRUE_WEIGHTED = replace(TRUE_STEP, per_byte_token_s=2e-12, per_revision_width_s=5e-9)
SHAPES = ((8, 1 << 20), (64, 8 << 20), (8, 3 << 20), (64, 24 << 20))  # (rank, bytes): 2 widths


def _weighted_steps(noise: float, seed: int = 0) -> list[StepSample]:
    """A calibration over attention-only and all-linear adapters (bytes per rank 131072 and
    393216), timed by a model whose LoRA work follows the bytes, not the rank alone."""
    rng = random.Random(seed)
    out = []
    for rank, nbytes in SHAPES:
        width = nbytes / rank
        for tokens in (1, 4, 16):
            for revisions in (1, 2, 4):
                regressors = (tokens, 0, revisions, tokens * rank)
                extra = {"byte_tokens": tokens * nbytes, "revision_widths": revisions * width}
                exact = TRUE_WEIGHTED.seconds(*regressors, **extra)
                step_s = exact * (1 + rng.gauss(0, noise))
                out.append(StepSample(*regressors, step_s, False, **extra))
        for length in (8, 32, 64):
            regressors = (0, length, 1, length * rank)
            extra = {"byte_tokens": length * nbytes, "revision_widths": width}
            exact = TRUE_IPC_S + TRUE_WEIGHTED.seconds(*regressors, **extra)
            out.append(StepSample(*regressors, exact * (1 + rng.gauss(0, noise)), True, **extra))
    return out


def test_fit_step_recovers_the_weight_terms_from_several_shapes() -> None:
    fitted = fit_step(_weighted_steps(noise=0.0))
    for name in (*TERMS, "per_byte_token_s", "per_revision_width_s"):
        assert getattr(fitted.step, name) == pytest.approx(getattr(TRUE_WEIGHTED, name), rel=1e-6)
    assert fitted.ipc_s == pytest.approx(TRUE_IPC_S, rel=1e-6)
    noisy = fit_step(_weighted_steps(noise=0.01, seed=5)).step
    assert noisy.per_byte_token_s == pytest.approx(2e-12, rel=0.25)
    assert noisy.per_revision_width_s == pytest.approx(5e-9, rel=0.25)


def test_samples_without_bytes_fit_the_old_terms_only() -> None:
    step = fit_step(_steps(noise=0.0)).step
    assert step.per_byte_token_s is None and step.per_revision_width_s is None
    assert not step.prices_weights


def test_one_target_set_cannot_identify_the_weight_terms() -> None:
    attention_only = [s for s in _weighted_steps(0.0) if s.revision_widths / s.revisions == 131072]
    with pytest.raises(ValueError, match="two or more target sets"):
        fit_step(attention_only)
    with pytest.raises(ValueError, match="byte_tokens"):
        StepSample(1, 0, 1, 8, 0.1, byte_tokens=-1)


@pytest.mark.parametrize(
    ("handoff", "link", "other"),
    [("load_handoff_s", "L3_to_L2", "L1_to_L0"), ("copy_handoff_s", "L1_to_L0", "L3_to_L2")],
)
def test_a_measured_handoff_is_charged_on_its_link(handoff: str, link: str, other: str) -> None:
    """A cold load's wait is charged where it starts, the copy's on the copy into a slot."""
    loads = [LoadSample(name, n, 0.001 + n / 1e9) for name in LINKS for n in (1 << 20, 8 << 20)]
    args = ("cpu-test", _steps(0.0), loads, {}, {"command": "c"})
    plain = calibrated_model(*args)

    def handed_by(seconds: float) -> CostModel:
        if handoff == "load_handoff_s":
            return calibrated_model(*args, load_handoff_s=seconds)
        return calibrated_model(*args, copy_handoff_s=seconds)

    handed = handed_by(0.014)
    assert handed.links[link].fixed_s == pytest.approx(plain.links[link].fixed_s + 0.014)
    assert handed.links[link].bytes_per_s == plain.links[link].bytes_per_s
    assert handed.links["L2_to_L1"] == plain.links["L2_to_L1"]
    assert handed.links[other] == plain.links[other]
    for bad in (-0.001, float("nan")):
        with pytest.raises(ValueError, match=handoff):
            handed_by(bad)


def test_the_cost_models_load_cpu_shared_is_the_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    """``calibrate`` takes ``load_cpu_shared`` from its target (``--self``'s demo server always
    shares its CPU), so ``bench sim``'s own calibration writes what ``sim calibrate --self``
    writes (it wrote false before 2026-12-04, SIMVAL)."""
    from sim_inputs import calibration_measured

    from loraplex.bench.sim import calibration
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import Target

    measured = calibration_measured()
    measured.update(cold=[], residuals=[])
    monkeypatch.setattr(calibration, "measure", lambda target, config: dict(measured))
    shared = Target("http://x", "k", (), {}, 100, load_cpu_shared=True)
    model, _ = calibration.calibrate(shared, CalibrateConfig(), "hw", "cmd")
    assert model.load_cpu_shared is True
    assert "CPU-only" in model.sources["load_cpu_shared"]
    apart, _ = calibration.calibrate(
        Target("http://x", "k", (), {}, 100), CalibrateConfig(), "hw", "cmd"
    )
    assert apart.load_cpu_shared is False


def test_the_hop_samples_are_paced_like_a_trace() -> None:
    """The lone warm requests of a prefill sample: ``hop_gap_s`` apart from the first, each of
    ``hop_output_tokens`` tokens; the two settings are checked."""
    from loraplex.bench.sim.calibrate_prefill import hop_requests
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import ServedAdapter

    adapter = ServedAdapter("t", "a", "r1", 8)
    config = CalibrateConfig(overhead_requests=3, hop_gap_s=0.5, hop_output_tokens=5)
    requests = hop_requests(adapter, config, 16)
    assert [r.t_s for r in requests] == [0.5, 1.0, 1.5]
    assert {(r.tenant, r.adapter, r.prompt_tokens, r.output_tokens) for r in requests} == {
        ("t", "a", 16, 5)
    }
    for bad, message in (
        ({"hop_gap_s": -0.1}, "hop_gap_s"),
        ({"hop_gap_s": float("inf")}, "hop_gap_s"),
        ({"hop_output_tokens": 0}, "hop_output_tokens"),
    ):
        with pytest.raises(ValueError, match=message):
            CalibrateConfig(**bad)  # type: ignore[arg-type]


def test_the_calibration_asks_for_the_slots_its_largest_mix_needs_beside_automatic_pins() -> None:
    # bench sim without --cost-model calibrated on 4 slots, when a tenant's share of them was a
    # hard cap: its half (2) could not hold a 4-adapter mix, and the prefetch was refused (503).
    # The share is work-conserving now: the calibration's one tenant borrows the slots
    # into_slots frees, and only the server's automatic GPU pins (a quarter of the slots) of
    # adapters outside the mix stay; sizing by the share (4 / 0.5 = 8) over-provisioned.
    import hashlib

    from loraplex.artifacts.identity import AdapterKey
    from loraplex.bench.sim.calibrate_run import CalibrateConfig, slots_for_mixes
    from loraplex.residency.ledger import Tier, TierBudget, TierLedger
    from loraplex.residency.warm import default_auto_gpu_slots
    from loraplex.serve.config import DEFAULT_TENANT_TIER_SHARE

    config = CalibrateConfig()
    need = max(config.revision_counts)

    def mix_fits_in_free_slots(slots: int) -> bool:
        """into_slots on a server of ``slots`` (share as served): its other copies evicted but
        the pinned ones, does every adapter of the largest mix load into a free slot?"""
        budget = TierBudget(slots, slots, default_tenant_share=DEFAULT_TENANT_TIER_SHARE)
        ledger = TierLedger(Tier.L0, budget)

        def copy(name: str) -> AdapterKey:
            return AdapterKey(
                "b" * 64, "self", name, "r1", hashlib.sha256(name.encode()).hexdigest()
            )

        for i in range(default_auto_gpu_slots(slots)):
            entry = ledger.reserve(copy(f"pinned{i}"), 1, 0.0)
            entry.ready = entry.pinned = True
        for i in range(need):
            if ledger.plan_room("self", 1, lambda: list(ledger.entries.values())) != []:
                return False
            ledger.reserve(copy(f"mix{i}"), 1, 0.0).ready = True
        return True

    slots = slots_for_mixes(config)
    assert slots == 5 and mix_fits_in_free_slots(slots)
    assert not mix_fits_in_free_slots(slots - 1)  # and no more than that
    assert slots_for_mixes(replace(config, revision_counts=(1, 2, 4, 8))) == 10  # 8 + 2 pins


def _lone(hop_s: float, late: dict[int, float]) -> list:
    """8 lone requests per prefill sample of ``calibration_measured``'s shapes (exact step +
    ``hop_s``), those of the samples in ``late`` that many seconds later on the client's side."""
    from sim_inputs import calibration_measured

    from loraplex.sim.calibrate import StepSample

    hops = [s for s in calibration_measured()["steps"] if s.hop]
    out = []
    for i, s in enumerate(hops):
        step_s = 0.004 + 2e-5 * s.prefill_tokens + 1e-7 * s.rank_tokens  # the hop samples' truth
        for _ in range(8):
            out.append((StepSample(0, s.prefill_tokens, 1, s.rank_tokens, 1.0, hop=True),
                        step_s + hop_s + late.get(i, 0.0)))  # fmt: skip
    return out


def test_the_hop_is_the_median_over_lone_requests_less_the_fitted_step() -> None:
    """``median_hop_s``: what a lone request's TTFT (less front_s) leaves beyond the step's
    price of its shape; a disturbance over one of four samples (its requests 20 ms late) moves
    a mean of the samples by 5 ms and this median not at all."""
    from loraplex.sim.calibrate import median_hop_s

    step = StepCost(0.002, 1e-4, 3e-4, 1e-7, per_prefill_token_s=2e-5)
    price = {n: 0.002 + 3e-4 + 2e-5 * n for n in (8, 32)}  # rank_tokens priced too, below
    clean = _lone(0.003, {})
    expected = statistics.median(t - price[s.prefill_tokens] - 1e-7 * s.rank_tokens
                                 for s, t in clean)  # fmt: skip
    assert median_hop_s(clean, step) == pytest.approx(expected)
    late = _lone(0.003, {0: 0.020})
    assert median_hop_s(late, step) == pytest.approx(median_hop_s(clean, step))
    per_sample = [statistics.mean(t for s2, t in late[8 * i : 8 * i + 8]) for i in range(4)]
    clean_means = [statistics.mean(t for s2, t in clean[8 * i : 8 * i + 8]) for i in range(4)]
    assert statistics.mean(per_sample) - statistics.mean(clean_means) == pytest.approx(0.005)
    with pytest.raises(ValueError, match="lone is empty"):
        median_hop_s([], step)


def test_the_calibration_takes_its_hop_from_the_lone_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With lone requests measured, ``ipc_s`` is their median beyond the fitted step (not the
    fit's own hop term); the report keeps each one; without, the fitted hop stands."""
    from sim_inputs import calibration_measured

    from loraplex.bench.sim import calibration
    from loraplex.bench.sim.calibrate_run import CalibrateConfig
    from loraplex.bench.sim.calibrate_target import Target
    from loraplex.sim.calibrate import median_hop_s

    measured = calibration_measured()
    measured.update(cold=[], residuals=[])
    monkeypatch.setattr(calibration, "measure", lambda target, config: dict(measured))
    target = Target("http://x", "k", (), {}, 100)
    fitted, _ = calibration.calibrate(target, CalibrateConfig(), "hw", "cmd")
    assert fitted.ipc_s == pytest.approx(measured["step_fit"].ipc_s)
    measured["lone"] = _lone(0.003, {0: 0.020})
    model, report = calibration.calibrate(target, CalibrateConfig(), "hw", "cmd")
    assert model.ipc_s == pytest.approx(median_hop_s(measured["lone"], model.step))
    assert model.ipc_s != pytest.approx(fitted.ipc_s)
    assert len(report["lone_ttfts_s"]) == 32
    assert "median over 32 lone warm requests" in model.sources["ipc_s"]
    assert "fitted with the step" in fitted.sources["ipc_s"]
