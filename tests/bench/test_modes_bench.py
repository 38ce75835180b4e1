"""``bench modes``: one short run reports every Done-when figure, and the probes guard it: a
merge that changes a greedy continuation fails the bench."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from loraplex.bench.modes import bench as modes
from loraplex.bench.modes.decisions import auto_costs, auto_decision, gain_bound
from loraplex.bench.modes.figures import hot_as_base
from loraplex.bench.modes.parity import ParityReport, ParityRule, ProbeMismatchError
from loraplex.bench.modes.plot import modes_plot
from loraplex.bench.modes.setup import HOT, NUM_ADAPTERS, ModesBenchConfig, Setup, probes
from loraplex.cli import app
from loraplex.engine.mode_policy import MeasuredCosts
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.layers import PackedLinear, packed_available
from loraplex.model.llama import ForwardBatch, LoraApplier, layer_linears
from loraplex.model.merge import linear_of
from loraplex.model.staged_merge import MergeStaging

QUICK = ModesBenchConfig(
    rounds=1,
    calls_per_round=1,
    num_transitions=2,
    probe_tokens=3,
    replay_requests=4,
    single_rounds=2,
    sample_ms=1.0,
    single_blocks=3,
)


def test_one_run_reports_every_figure(tmp_path: Path) -> None:
    result = modes.run_modes_bench(QUICK)
    metrics = result["metrics"]
    assert isinstance(metrics, dict)
    for key in (
        "single_merged_over_base",
        "single_merged_over_unmerged",
        "unmerged_lora_overhead",
        "skewed80_auto_over_unmerged",
        "uniform16_auto_over_unmerged",
        "prefill_unmerged_lora_overhead",
        "prefill_skewed80_merged_over_unmerged",
        "skewed80_free_negative_over_unmerged",
        "prefill_skewed80_free_negative_over_unmerged",
    ):
        assert metrics[key] is None or metrics[key] > 0, key
    paired = metrics["single_paired"]  # per-round ratios beside the ratios of medians
    for key in (
        "merged_over_base",
        "merged_over_unmerged",
        "unmerged_lora_overhead",
        "base_again_over_base",
        "unmerged_again_over_unmerged",
    ):
        summary = paired[key]
        assert summary["rounds"] == 2, key
        assert 0 < summary["min"] <= summary["median"] <= summary["max"], key
    assert set(paired["calls_per_block"]) == {
        "base",
        "unmerged",
        "merged",
        "base_again",
        "unmerged_again",
    }
    assert paired["blocks_per_sample"] == 3
    assert set(metrics["single_tokens_per_s"]) == {"base", "unmerged", "merged"}
    assert metrics["single_merged_over_base"] == pytest.approx(
        metrics["single_tokens_per_s"]["merged"] / metrics["single_tokens_per_s"]["base"]
    )
    assert 0.5 < metrics["skewed80_hot_share"] < 1.0
    assert metrics["skewed80_gain_bound"] == gain_bound(
        metrics["skewed80_hot_share"], metrics["skewed80_lora_overhead"]
    )
    assert metrics["prefill_skewed80_lora_overhead"] > 0
    modes_plot(result, tmp_path / "modes.png")
    assert (tmp_path / "modes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert metrics["mode_transition_ms_p50"] <= metrics["mode_transition_ms_p99"]
    assert metrics["uniform16_auto_merged_slot"] is None  # uniform traffic never merges
    assert metrics["mode_flaps_per_min"] <= 1.0
    replayed = metrics["skewed80_replay"]["auto_lora_s_per_token"]  # what step-level auto weighed
    assert metrics["auto_costs"]["lora_measured"] == (replayed is not None)
    assert metrics["probes_identical"] == 1 + 2 * NUM_ADAPTERS
    parity = metrics["parity"]  # float32: exact, every probe and replayed request identical
    assert parity["rule"]["exact"] and parity["num_divergences"] == 0
    assert parity["compared"] == parity["identical"] > 1 + 2 * NUM_ADAPTERS
    for name in ("skewed80_replay", "uniform16_replay"):  # request-level, both modes
        replay = metrics[name]
        assert isinstance(replay, dict) and replay["replays_per_mode"] == 2, name
        for key in ("throughput_auto_over_unmerged", "ttft_p99_auto_over_unmerged"):
            assert replay[key] > 0, (name, key)
        assert replay["unmerged_ttft_ms_p50"] <= replay["unmerged_ttft_ms_p99"]
    assert metrics["uniform16_replay"]["auto_transitions"] == 0  # uniform: auto never merges
    forced = metrics["skewed80_unmerged_strategies"]  # each strategy timed on the same batch
    assert set(forced["tokens_per_s"]) == {"masked", "grouped", "batched", "auto"}  # float32
    assert forced["auto_chose"] == forced["auto_ran_as"] in ("masked", "grouped", "batched")
    assert forced["best_forced"] in ("masked", "grouped", "batched")
    assert forced["auto_over_best_forced"] > 0
    want = "packed" if packed_available() else "blas"  # float32 on a CPU: auto packs
    assert result["config"]["base_linear_kernel_ran"] == want


@pytest.mark.skipif(not packed_available(), reason="this torch cannot pack weights")
def test_the_merged_side_runs_current_packed_copies(tmp_path: Path) -> None:
    """Unmerged and merged run one model: after the bench's merge and unmerge every base
    linear's packed copy is of the weight as written (not the dense fallback, nor a stale
    copy), and the logits equal those of an unpacked (oneDNN on the dense weights) setup."""
    packed = Setup(tmp_path / "p", QUICK)
    dense = Setup(tmp_path / "d", replace(QUICK, base_linear_kernel="onednn"))
    kernel = packed.model._linear
    assert isinstance(kernel, PackedLinear) and dense.model.linear_kernel == "onednn"
    linears = [m.weight for layer in packed.model.model.layers for m in layer_linears(layer)]
    slots: list[int | None] = [HOT, HOT, HOT, 1, None]
    for _ in range(2):
        merged, reference = packed.merge(HOT), dense.merge(HOT)
        assert all(kernel.is_current(weight) for weight in linears)
        assert torch.equal(logits(packed, slots, merged), logits(dense, slots, reference))
        packed.unmerge()
        dense.unmerge()
        assert all(kernel.is_current(weight) for weight in linears)
        got, want = logits(packed, slots, packed.pool), logits(dense, slots, dense.pool)
        assert torch.equal(got, want)


def logits(setup: Setup, slots: list[int | None], lora: LoraApplier) -> torch.Tensor:
    """One 4-token prompt per slot in ``slots``, prefilled in one forward."""
    model, n = setup.model, 4
    kv = ContiguousKVCache(model.attention_shape, len(slots), n, dtype=model.dtype,
                           device=model.device)  # fmt: skip
    chunks = [SequenceChunk(kv.allocate(), 0, n) for _ in slots]
    tokens = [5 + i for i in range(n * len(slots))]
    token_slots = [-1 if s is None else s for s in slots for _ in range(n)]
    batch = ForwardBatch.build(tokens, chunks, token_slots=token_slots)
    return model.forward_batch(batch, kv, lora)


def test_step_level_auto_weighs_the_cost_the_replay_measured_or_nothing() -> None:
    prior = MeasuredCosts(0.005, 3e-5, unmerged_step_s_per_token=1e-3)
    got = auto_costs(prior, {"auto_lora_s_per_token": 1.4e-3})
    assert (got.lora_s_per_token, got.lora_measured) == (1.4e-3, True)
    unmeasured = auto_costs(prior, {"auto_lora_s_per_token": None})
    assert not unmeasured.lora_measured  # the pair's figure is a prior: no merge on it
    assert auto_decision([HOT] * 16 + [1, 2, 3, 4], unmeasured) is None
    assert auto_decision([HOT] * 16 + [1, 2, 3, 4], got) == HOT


def test_the_ceiling_runs_the_hot_sequences_on_the_base_model() -> None:
    slots = [HOT, 3, None, HOT, 7]
    assert hot_as_base(slots) == [None, 3, None, None, 7]  # the others keep theirs


def test_the_gain_bound_follows_the_per_token_model() -> None:
    assert gain_bound(0.8, 1.15) == pytest.approx(1 / (1 - 0.6 * (1 - 1 / 1.15)))
    assert gain_bound(0.5, 1.15) == pytest.approx(1.0)  # half the traffic: no gain
    assert gain_bound(1.0, 1.15) == pytest.approx(1.15)  # all of it: the whole overhead
    assert gain_bound(0.3, 1.15) < 1.0  # a minority revision merged: a loss
    assert gain_bound(0.8, None) is None


def test_a_wrong_merge_fails_the_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(tmp_path, QUICK)
    real_commit = setup.merger.commit  # the bench's merges are staged, then committed

    def wrong(staging: MergeStaging) -> None:
        real_commit(staging)
        for module in staging.weights.modules:  # a far larger delta than the adapter's
            weight = linear_of(setup.model, module.layer, module.module).weight
            weight.add_(module.scale * 50 * module.lora_b.float() @ module.lora_a.float())

    monkeypatch.setattr(setup.merger, "commit", wrong)
    with torch.no_grad(), pytest.raises(ProbeMismatchError, match="merged"):
        probes(setup, ParityReport(ParityRule(exact=True)))


def test_the_config_refuses_a_base_kernel_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="base_linear_kernel: linear_kernel 'mkl' is invalid"):
        ModesBenchConfig(base_linear_kernel="mkl")
    with pytest.raises(ValueError, match=r"base_linear_kernel: .*'packed' is invalid with"):
        ModesBenchConfig(dtype="bfloat16", base_linear_kernel="packed")
    assert ModesBenchConfig(base_linear_kernel="blas").base_linear_kernel == "blas"


def test_the_config_refuses_an_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="int8"):
        ModesBenchConfig(dtype="int8")
    assert ModesBenchConfig(dtype="bfloat16").dtype == "bfloat16"


def test_the_config_refuses_bad_single_revision_timing() -> None:
    with pytest.raises(ValueError, match="single_rounds"):
        ModesBenchConfig(single_rounds=0)
    with pytest.raises(ValueError, match="single_blocks 0 is invalid"):
        ModesBenchConfig(single_blocks=0)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="sample_ms"):
            ModesBenchConfig(sample_ms=bad)


def test_the_hot_revision_takes_the_rank_asked_and_the_mix_stays() -> None:
    from loraplex.bench.modes.setup import RANKS, slot_rank

    for hot_rank in RANKS:
        ranks = [slot_rank(slot, hot_rank) for slot in range(NUM_ADAPTERS)]
        assert ranks[0] == hot_rank
        assert sorted(ranks) == sorted(RANKS * (NUM_ADAPTERS // len(RANKS)))
    with pytest.raises(ValueError, match="hot_rank 12 is invalid"):
        modes.ModesBenchConfig(hot_rank=12)


def test_the_cli_passes_the_single_revision_timing_or_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[ModesBenchConfig] = []

    def fake_run(config: ModesBenchConfig) -> dict[str, object]:
        seen.append(config)
        return {"name": "modes"}

    monkeypatch.setattr(modes, "run_modes_bench", fake_run)
    args = ["bench", "modes", "--json", "--single-rounds", "9", "--sample-ms", "40"]
    result = CliRunner().invoke(app, [*args, "--single-blocks", "5"])
    assert result.exit_code == 0, result.output
    assert (seen[0].single_rounds, seen[0].sample_ms, seen[0].single_blocks) == (9, 40.0, 5)
    result = CliRunner().invoke(app, ["bench", "modes", "--json", "--single-blocks", "0"])
    assert result.exit_code != 0 and "single_blocks" in result.output
    result = CliRunner().invoke(app, ["bench", "modes", "--json", "--sample-ms", "0"])
    assert result.exit_code != 0 and "sample_ms" in result.output
    result = CliRunner().invoke(app, ["bench", "modes", "--json", "--base-linear-kernel", "blas"])
    assert result.exit_code == 0, result.output
    assert seen[-1].base_linear_kernel == "blas"
    result = CliRunner().invoke(app, ["bench", "modes", "--base-linear-kernel", "mkl"])
    assert result.exit_code != 0 and "base_linear_kernel" in result.output
