"""``auto``'s merged-slower veto (StepCosts) against a traffic mix that differs between the two
modes. Per-token step costs fall with a step's size (its fixed cost is shared by more tokens),
so a stretch of large unmerged steps (long prompts) followed by small merged ones (decodes) read
as "merged is slower" when merging changed nothing, and the veto then held for the engine's
life: one tenant's traffic mix, once, kept every tenant's hot revision unmerged for good. The
veto now compares steps of one size with each other and is forgotten ``veto_s`` later."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator, Mapping

import pytest

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.engine.mode_control import ModeController, ref_of
from loraplex.engine.mode_costs import StepCosts
from loraplex.engine.mode_policy import SLOWER_MARGIN, ModePolicyConfig, ModeSetting
from loraplex.engine.modes import ModeSwitcher, TransitionKind
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.engine.step import StepPlan
from loraplex.sampling import SamplingParams

POLICY = ModePolicyConfig(
    window_s=5.0,
    min_dwell_s=3.0,
    payback_s=1e9,  # any measured LoRA cost pays: only the veto can keep a merge away
    min_measured_steps=3,
    min_window_tokens=1,
    veto_s=100.0,
)


@pytest.fixture
def engine(demo_assets: DemoAssets) -> Iterator[OfflineEngine]:
    config = OfflineConfig(max_loras=3, max_lora_rank=64)
    with OfflineEngine(demo_assets.base_model_dir, config) as offline:
        yield offline


def _skewed(demo_assets: DemoAssets, max_tokens: int) -> list[OfflineRequest]:
    hot = demo_assets.adapter("acme", "billing", "r1")
    cold = demo_assets.adapter("globex", "codegen", "r1")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [OfflineRequest(hot.probe_prompt, hot.path, params)] * 4 + [
        OfflineRequest(cold.probe_prompt, cold.path, params)
    ]


def _even(demo_assets: DemoAssets, max_tokens: int) -> list[OfflineRequest]:
    """Five requests over three revisions (2, 2, 1; one per GPU slot, all running at once): no
    revision's share (0.4 at most) merges; decode steps of five tokens, the size of the skewed
    traffic's (the veto compares steps of one exact size), are measured unmerged."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    names = [("acme", "billing"), ("globex", "codegen"), ("acme", "support")]
    adapters = [demo_assets.adapter(tenant, name, "r1") for tenant, name in names]
    prompt = adapters[0].probe_prompt  # one length: shares by request count
    return [OfflineRequest(prompt, a.path, params) for a in adapters for _ in range(2)][:5]


def _long_prompts() -> list[OfflineRequest]:
    """A tenant's long prompts on the base model with one output token each: large prefill
    steps only, cheap per token, and no revision's share to merge."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = " ".join(["the support team answers"] * 40)
    return [OfflineRequest(prompt, None, params)] * 6


def _costed(
    engine: OfflineEngine, clock: ManualClock, cost: Callable[[bool, int], float]
) -> ModeController:
    """An ``auto`` controller whose steps take ``cost(merged, num_tokens)`` seconds."""
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock)
    control = ModeController(ModeSetting.parse("auto"), switcher, engine.runtime.cache, clock,
                             policy=POLICY, lora_s_per_token=1e-3)  # fmt: skip
    engine.core.modes = control
    timed = control.after_step

    def after_step(
        plan: StepPlan,
        keys: Mapping[str, AdapterKey | None],
        tenants: Mapping[str, str] | None = None,
        probes: Collection[str] = (),
    ) -> None:
        clock.advance(cost(control.switcher.merged_revision is not None, plan.num_tokens))
        timed(plan, keys, tenants, probes)

    control.after_step = after_step  # type: ignore[method-assign]
    return control


def _run(engine: OfflineEngine, requests: list[OfflineRequest], clock: ManualClock) -> None:
    want = [r.token_ids for r in engine.generate(requests)] if engine.core.modes is None else None

    def tick(_step: int) -> None:
        clock.advance(1.0)

    got = [r.token_ids for r in engine.generate(requests, tick)]
    assert want is None or got == want


def test_a_mix_of_large_unmerged_and_small_merged_steps_does_not_veto_merging(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    """Merging changes nothing here (one cost function of the step's size for both modes); the
    merged steps (decodes) are only smaller than the unmerged prefill steps just before them (a
    tenant's long prompts). Decode steps of one size were measured in both modes: they compare
    equal, and the hot revision stays merged."""
    hot_ref = ref_of(engine.adapter_key(demo_assets.adapter("acme", "billing", "r1").path))
    engine.generate(_even(demo_assets, 2))  # the three adapters resident: steps hold all five
    clock = ManualClock()
    control = _costed(engine, clock, lambda _merged, tokens: 4e-3 + 1e-5 * tokens)
    _run(engine, _even(demo_assets, 16), clock)  # decode steps of five measured unmerged
    for _ in range(4):  # then a tenant's long prompts: the last unmerged steps are all large
        _run(engine, _long_prompts(), clock)
    assert control.transitions == []
    clock.advance(POLICY.window_s)
    _run(engine, _skewed(demo_assets, 16), clock)  # merged: decode steps of five
    clock.advance(POLICY.window_s + POLICY.min_dwell_s)
    _run(engine, _skewed(demo_assets, 16), clock)
    assert control.transitions and control.transitions[0].kind is TransitionKind.MERGE
    assert control.switcher.merged_revision == hot_ref, [t.kind for t in control.transitions]
    control.close()
    engine.runtime.cache.check_integrity()


def test_a_merged_slower_verdict_is_measured_again_after_veto_s(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    """Merged steps really slower (2 ms a token against 1 ms): auto unmerges; ``veto_s`` later
    the next merge measures them again (and unmerges again), instead of never merging again."""
    engine.generate(_even(demo_assets, 2))
    clock = ManualClock()
    control = _costed(engine, clock, lambda merged, tokens: (2e-3 if merged else 1e-3) * tokens)
    _run(engine, _even(demo_assets, 16), clock)
    _run(engine, _skewed(demo_assets, 16), clock)
    kinds = [t.kind for t in control.transitions]
    assert kinds == [TransitionKind.MERGE, TransitionKind.UNMERGE]
    clock.advance(POLICY.veto_s)
    _run(engine, _skewed(demo_assets, 24), clock)
    kinds = [t.kind for t in control.transitions]
    assert kinds == [TransitionKind.MERGE, TransitionKind.UNMERGE] * 2
    assert control.switcher.merged_revision is None
    control.close()
    engine.runtime.cache.check_integrity()


def test_step_costs_compare_merged_with_unmerged_steps_of_the_same_size() -> None:
    costs = StepCosts(weight=1.0, min_steps=2)
    for _ in range(2):
        costs.record(False, 0.1, 100)  # large unmerged steps: 1 ms a token
        costs.record(True, 0.04, 4)  # small merged steps: 10 ms a token
    assert costs.merged_like_unmerged() is None  # no size measured in both modes
    for _ in range(2):
        costs.record(False, 0.036, 4)  # small unmerged steps: 9 ms a token
    unmerged = costs.per_token(False)
    assert unmerged == pytest.approx(9e-3)  # weight 1: the last unmerged step
    assert costs.merged_like_unmerged() == pytest.approx(unmerged * 10 / 9)
    costs.forget_merged()
    assert costs.per_token(True) is None and costs.merged_like_unmerged() is None


def _verdict(unmerged: list[tuple[int, float]], merged: list[tuple[int, float]]) -> float | None:
    """merged_like_unmerged / per_token(False) after these steps ((tokens, seconds) each, the
    unmerged ones first, as ``auto`` runs them: a baseline, then the merge); None: no verdict."""
    costs = StepCosts(min_steps=8)
    for tokens, seconds in unmerged:
        costs.record(False, seconds, tokens)
    for tokens, seconds in merged:
        costs.record(True, seconds, tokens)
    figure, base = costs.merged_like_unmerged(), costs.per_token(False)
    return None if figure is None or base is None else figure / base


def test_a_batch_draining_below_the_size_measured_unmerged_does_not_veto_merging() -> None:
    """The replay's closed loop (bench modes): decode steps of 20 sequences measured unmerged,
    then, merged, 20 again and the drain at the trace's end (19, 18, 17, 16 sequences). A decode
    step costs about the same whatever its sequences (the weights' reads), so a step of 16 costs
    1.25x per token what one of 20 does; merged steps here are 5 % faster, size for size. On the
    old code sizes 16-31 were one bucket, and the drain read as "merged is slower"."""
    unmerged = [(20, 0.100)] * 10
    merged = [(20, 0.095)] * 8 + [(n, 0.095) for n in (19, 18, 17, 16) for _ in range(3)]
    verdict = _verdict(unmerged, merged)
    assert verdict is not None and verdict < SLOWER_MARGIN  # the 20s: 0.95


def test_one_preempted_merged_step_does_not_veto_merging() -> None:
    """Merged steps 20 % faster, but the first one preempted (on a shared 2-core machine a step
    took 7x its time): on the old code each size's figure was an average seeded by its first
    step (weight 0.9^7 after eight), and read 3.1x."""
    unmerged = [(20, 0.100)] * 10
    merged = [(20, 0.560)] + [(20, 0.080)] * 7
    verdict = _verdict(unmerged, merged)
    assert verdict is not None and verdict < 1.0


def test_a_drift_of_the_machine_is_no_verdict_a_consistent_slowdown_is() -> None:
    """Load drifting between the unmerged stretch and the merged one moves the medians apart
    (here 8 %) while the two sets of steps still overlap: no verdict (1.0). On the old code that
    vetoed merging (in 4 of 6 unmerged replays of the large preset, split where ``auto`` would
    have merged, nothing merged at all: docs/modes.md, "The veto's evidence"). Merged steps
    consistently slower (every one slower than every unmerged step) still veto."""
    spread = [0.090, 0.095, 0.100, 0.105, 0.110] * 2
    unmerged = [(20, s) for s in spread]
    drifted = [(20, s * 1.08) for s in spread]
    assert _verdict(unmerged, drifted) == pytest.approx(1.0)
    slower = [(20, s * 1.25) for s in spread]
    verdict = _verdict(unmerged, slower)
    assert verdict is not None and verdict > SLOWER_MARGIN


def test_step_costs_keep_the_latest_steps_of_the_latest_sizes() -> None:
    costs = StepCosts(min_steps=2, keep=2, max_sizes=2)
    for tokens in (10, 20, 30):  # three sizes merged: the least recently run (10) is forgotten
        costs.record(False, 0.01 * tokens, tokens)
        costs.record(False, 0.01 * tokens, tokens)
        costs.record(True, 0.02 * tokens, tokens)
        costs.record(True, 0.02 * tokens, tokens)
    assert costs.merged_like_unmerged() == pytest.approx(0.02)  # 20 and 30: 2x, consistently
    for _ in range(2):  # the size's two latest steps are its figure: merged now as fast
        costs.record(True, 0.01 * 30, 30)
        costs.record(True, 0.01 * 20, 20)
    assert costs.merged_like_unmerged() == pytest.approx(0.01)
    with pytest.raises(ValueError, match="keep 1 is invalid"):
        StepCosts(min_steps=2, keep=1)
    with pytest.raises(ValueError, match="max_sizes 0 is invalid"):
        StepCosts(max_sizes=0)


def test_the_kept_ratios_are_those_made_afresh() -> None:
    """Each size's ratio is kept until a step of that size runs (or the size is forgotten, or
    merged figures are dropped): after every step, the figure equals one made from the steps."""
    rng = random.Random(7)
    costs = StepCosts(min_steps=2, keep=4, max_sizes=5)
    for step in range(600):
        merged = rng.random() < 0.5
        costs.record(merged, rng.uniform(0.5, 1.5) * 0.01, rng.randint(1, 8))
        if step % 97 == 96:
            costs.forget_merged()
        kept = costs.merged_like_unmerged()
        costs._ratios.clear()  # made afresh from the kept steps
        assert costs.merged_like_unmerged() == kept
