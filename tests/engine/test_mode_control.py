"""The mode setting in a running engine: ``auto`` merges a revision that dominates the traffic
and unmerges when it stops; ``merged:<ref>`` merges the named revision; outputs never change."""

from __future__ import annotations

import shutil
from collections.abc import Collection, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.engine.mode_control import ModeController, ref_of
from loraplex.engine.mode_policy import ModePolicyConfig, ModeSetting
from loraplex.engine.modes import ModeSwitcher, TransitionKind
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.engine.step import StepPlan
from loraplex.model.adapter_weights import AdapterWeights
from loraplex.model.staged_merge import MergeStaging
from loraplex.residency.ledger import Tier
from loraplex.residency.warm import ZERO_RATES
from loraplex.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
# A tiny model's few tokens: ``min_window_tokens`` has its own test (test_mode_policy.py).
POLICY = ModePolicyConfig(
    window_s=5.0, min_dwell_s=3.0, payback_s=10.0, min_measured_steps=3, min_window_tokens=1
)


@pytest.fixture
def engine(demo_assets: DemoAssets) -> Iterator[OfflineEngine]:
    config = OfflineConfig(max_loras=3, max_lora_rank=64)
    with OfflineEngine(demo_assets.base_model_dir, config) as offline:
        yield offline


def controller(
    engine: OfflineEngine,
    mode: str,
    clock: ManualClock,
    lora_s_per_token: float = 1e-3,
    policy: ModePolicyConfig = POLICY,
) -> ModeController:
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock)
    control = ModeController(ModeSetting.parse(mode), switcher, engine.runtime.cache, clock,
                             policy=policy, lora_s_per_token=lora_s_per_token)  # fmt: skip
    engine.core.modes = control
    return control


def skewed_requests(demo_assets: DemoAssets, max_tokens: int) -> list[OfflineRequest]:
    """Four requests of one revision and one of another, greedy, ``max_tokens`` each."""
    hot = demo_assets.adapter("acme", "billing", "r1")
    cold = demo_assets.adapter("globex", "codegen", "r1")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [OfflineRequest(hot.probe_prompt, hot.path, params)] * 4 + [
        OfflineRequest(cold.probe_prompt, cold.path, params)
    ]


def ticking(clock: ManualClock) -> object:
    def tick(_step: int) -> None:
        clock.advance(1.0)

    return tick


def test_auto_merges_the_dominant_revision_then_unmerges(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    hot = demo_assets.adapter("acme", "billing", "r1")
    cold = demo_assets.adapter("globex", "codegen", "r1")
    skewed = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY)] * 4 + [
        OfflineRequest(cold.probe_prompt, cold.path, GREEDY)
    ]
    want = [r.token_ids for r in engine.generate(skewed)]
    clock = ManualClock()
    # the measured CPU cost (not the prior) decides: a long payback makes any measured cost pay
    control = controller(engine, "auto", clock, policy=replace(POLICY, payback_s=1e9))
    got = [r.token_ids for r in engine.generate(skewed, ticking(clock))]  # type: ignore[arg-type]
    assert got == want
    assert control.switcher.merged_revision == ref_of(engine.adapter_key(hot.path))
    others = [OfflineRequest(cold.probe_prompt, cold.path, GREEDY)] * 3
    want_others = [r.token_ids for r in engine.generate(others)]
    clock.advance(POLICY.window_s)  # the hot revision's tokens leave the window
    assert [r.token_ids for r in engine.generate(others, ticking(clock))] == want_others  # type: ignore[arg-type]
    kinds = [t.kind for t in control.transitions]
    assert kinds[:2] == [TransitionKind.MERGE, TransitionKind.UNMERGE]
    control.close()
    assert control.switcher.merged_revision is None
    engine.runtime.cache.check_integrity()


def huge_copy(adapter_dir: Path, root: Path, factor: float) -> Path:
    """A copy of ``adapter_dir`` whose A and B are scaled by ``factor`` each (finite)."""
    out = root / f"x{factor:g}"
    shutil.copytree(adapter_dir, out)
    weights = out / "adapter_model.safetensors"
    save_file({k: v * factor for k, v in load_file(weights).items()}, weights)
    return out


@pytest.mark.parametrize("mode", ["auto", "merged"])
def test_a_revision_whose_delta_swamps_the_base_is_never_merged(
    engine: OfflineEngine, demo_assets: DemoAssets, tmp_path: Path, mode: str
) -> None:
    """attack23: a tenant's adapter with huge finite weights (delta about 1e10 times the demo's)
    carrying most of the traffic was merged by ``auto`` (as by ``merged:<ref>``), and every
    other request's greedy tokens changed (float32: ``round(W + sBA) x - sBA x`` lost W). Now
    the merge is refused once, by name, and never asked for again: others' tokens are the
    unmerged ones and nothing is merged."""
    hot = demo_assets.adapter("acme", "billing", "r1")
    cold = demo_assets.adapter("globex", "codegen", "r1")
    huge = huge_copy(hot.path, tmp_path, 1e5)
    skewed = [OfflineRequest(hot.probe_prompt, huge, GREEDY)] * 4 + [
        OfflineRequest(cold.probe_prompt, cold.path, GREEDY),
        OfflineRequest(cold.probe_prompt, None, GREEDY),
    ]
    want = [r.token_ids for r in engine.generate(skewed)]
    ref = ref_of(engine.adapter_key(huge))
    clock = ManualClock()
    setting = "auto" if mode == "auto" else f"merged:{ref}"
    control = controller(engine, setting, clock, policy=replace(POLICY, payback_s=1e9))
    merges = 0
    stage = control.switcher._merger.stage  # a CPU merge is staged

    def counted(weights: AdapterWeights) -> MergeStaging:
        nonlocal merges
        merges += 1
        return stage(weights)

    control.switcher._merger.stage = counted  # type: ignore[method-assign]
    got = [r.token_ids for r in engine.generate(skewed, ticking(clock))]  # type: ignore[arg-type]
    got += [r.token_ids for r in engine.generate(skewed, ticking(clock))]  # type: ignore[arg-type]
    assert got[4:6] == want[4:6] and got[10:] == want[4:]
    assert control.switcher.merged_revision is None and control.transitions == []
    assert merges == 1
    assert "times the largest base weight" in control.switcher.refused[ref]
    engine.runtime.cache.check_integrity()


def test_static_merged_mode_merges_the_named_revision(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    hot = demo_assets.adapter("acme", "support", "r1")
    mixed = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY),
             OfflineRequest(hot.probe_prompt, None, GREEDY)]  # fmt: skip
    want = [r.token_ids for r in engine.generate(mixed)]
    ref = ref_of(engine.adapter_key(hot.path))
    control = controller(engine, f"merged:{ref}", ManualClock())
    assert [r.token_ids for r in engine.generate(mixed)] == want
    assert control.switcher.merged_revision == ref
    engine.core.close()
    assert control.switcher.merged_revision is None


def test_auto_measures_unmerged_steps_first_and_unmerges_when_merged_is_slower(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    """Merging at start-up left no unmerged steps to compare with, so the merged-slower veto
    never acted (issue 28). Here each step costs 1 ms per token unmerged and 2 ms merged (the
    clock advances by that before ``after_step`` times the step): auto must time
    ``min_measured_steps`` unmerged steps, merge, find merged slower (than unmerged steps of the
    same size), unmerge and stay so (for ``veto_s``: tests/engine/test_mode_veto.py)."""
    skewed = skewed_requests(demo_assets, 16)
    want = [r.token_ids for r in engine.generate(skewed)]
    clock = ManualClock()
    # a long payback: the measured LoRA cost says merge (the step costs below say otherwise)
    control = controller(engine, "auto", clock, policy=replace(POLICY, payback_s=1e9))
    timed = control.after_step
    merged_steps = 0

    def costed(
        plan: StepPlan,
        keys: Mapping[str, AdapterKey | None],
        tenants: Mapping[str, str] | None = None,
        probes: Collection[str] = (),
    ) -> None:
        nonlocal merged_steps
        merged = control.switcher.merged_revision is not None
        merged_steps += merged
        clock.advance((2e-3 if merged else 1e-3) * plan.num_tokens)
        timed(plan, keys, tenants, probes)

    control.after_step = costed  # type: ignore[method-assign]
    # the veto compares steps of one size: decode steps of five measured unmerged first (base
    # model requests: no revision to merge)
    base = [replace(request, adapter_dir=None) for request in skewed]
    engine.generate(base, ticking(clock))  # type: ignore[arg-type]
    assert control.transitions == []
    got = [r.token_ids for r in engine.generate(skewed, ticking(clock))]  # type: ignore[arg-type]
    assert got == want
    assert [t.kind for t in control.transitions] == [TransitionKind.MERGE, TransitionKind.UNMERGE]
    assert control.switcher.merged_revision is None
    assert merged_steps >= POLICY.min_measured_steps
    assert control.step_costs.per_token(True) > control.step_costs.per_token(False)  # type: ignore[operator]
    control.close()
    engine.runtime.cache.check_integrity()


def test_auto_measures_the_lora_cost_it_decides_with(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    """The per-token LoRA cost is measured on unmerged steps, not taken from the setting: with a
    prior of 0 the model says merging never pays, and only the measured cost (a long payback
    makes any measured cost pay) lets ``auto`` merge the dominant revision."""
    skewed = skewed_requests(demo_assets, 40)
    want = [r.token_ids for r in engine.generate(skewed)]
    clock = ManualClock()
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock)
    policy = replace(POLICY, payback_s=1e9, min_measured_steps=2)
    control = ModeController(ModeSetting.parse("auto"), switcher, engine.runtime.cache, clock,
                             policy=policy, lora_s_per_token=0.0)  # fmt: skip
    engine.core.modes = control
    got = [r.token_ids for r in engine.generate(skewed, ticking(clock))]  # type: ignore[arg-type]
    assert got == want
    assert control.lora_cost.measured and control.lora_cost.per_token() > 0
    assert control.transitions and control.transitions[0].kind is TransitionKind.MERGE
    assert engine.runtime.pool.op_timer is None  # merged steps are not timed; none left set
    control.close()


def test_auto_merges_only_on_a_measured_lora_cost_and_publishes_it(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    """The LoRA cost was timed on one unmerged step in ``LORA_TIMING_EVERY`` while merging only
    waited for ``min_measured_steps`` whole steps, so ``auto`` merged on its prior and the meter
    never filled (issue 28: ``auto_lora_s_per_token`` null in every replay). Now every unmerged
    step is timed until the meter is measured, no merge comes before, and the figure reaches
    the queue view and ``loraplex_mode_lora_seconds_per_token``."""
    from types import SimpleNamespace
    from typing import cast

    from prometheus_client import CollectorRegistry, generate_latest

    from loraplex.engine.protocol import EngineClient
    from loraplex.server.metrics_modes import ModeCollector

    skewed = skewed_requests(demo_assets, 16)
    clock = ManualClock()
    # a prior that would merge at once; the measured cost pays only over a long payback
    control = controller(engine, "auto", clock, 1.0, replace(POLICY, payback_s=1e9))
    begin = control.switcher.begin  # a merge begins (then is staged and committed)
    samples_at_merge: list[int] = []

    def counted(*args: object, **kwargs: object) -> object:
        samples_at_merge.append(control.lora_cost.num_samples)
        return begin(*args, **kwargs)  # type: ignore[arg-type]

    control.switcher.begin = counted  # type: ignore[method-assign]
    engine.generate(skewed, ticking(clock))  # type: ignore[arg-type]
    assert samples_at_merge and samples_at_merge[0] >= POLICY.min_measured_steps
    measured = engine.core.view.mode.lora_s_per_token  # type: ignore[union-attr]
    assert measured is not None and 0 < measured < 1.0  # measured, not the prior
    view = SimpleNamespace(load_snapshot=lambda: engine.core.view)
    registry = CollectorRegistry()
    registry.register(ModeCollector(cast(EngineClient, view)))
    assert b"loraplex_mode_lora_seconds_per_token" in generate_latest(registry)
    control.close()


def test_auto_charges_its_merge_to_the_tenant_whose_traffic_made_it_hot(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    """attack26: ``auto`` merges the revision carrying most tokens, which a caller of another
    tenant's public adapter chooses. Its lease named no tenant, so it moved the caller's GPU copy
    to the owner's charge (the merge's lease then held it in the owner's share). Now the merge
    names the tenant that carried the revision's tokens: the copy stays the caller's."""
    hot = demo_assets.adapter("acme", "billing", "r1")
    key = engine.adapter_key(hot.path)  # owned by the offline engine's one tenant
    make = engine._engine_request
    engine._engine_request = lambda r, k: replace(make(r, k), tenant="caller")  # type: ignore[method-assign]
    cache = engine.runtime.cache
    asks: list[str | None] = []  # each lease's requester: the lease desk's and the merge's
    acquire = cache.acquire_future

    def recorded(k: AdapterKey, **kwargs: Any) -> Any:
        asks.append(kwargs.get("requester"))
        return acquire(k, **kwargs)

    cache.acquire_future = recorded  # type: ignore[method-assign]
    clock = ManualClock()
    control = controller(engine, "auto", clock, policy=replace(POLICY, payback_s=1e9))
    engine.generate(skewed_requests(demo_assets, 10), ticking(clock))  # type: ignore[arg-type]
    ref = ref_of(key)
    assert asks and set(asks) == {"caller"}  # a load the merge's ask started: the caller's
    assert control.switcher.merged_revision == ref
    entry = cache.ledgers[Tier.L0].get(key)
    assert entry is not None and entry.refcount == 1  # the merge's lease
    assert entry.charged == "caller" and key.tenant != "caller"
    assert control.payer(ref) == "caller"
    control.close()
    cache.check_integrity()


def test_a_release_probe_is_not_traffic_auto_merges_on(
    engine: OfflineEngine, demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attack27: a release's output probes (``EngineRequest.probe``) ran on the engine and their
    tokens counted in ``auto``'s window, so a release's probes alone made ``auto`` merge the
    candidate they were still checking, before any tenant called it, and every other tenant's
    requests ran on the merged weights (a live demo server merged ``acme/support@r2`` while
    probing). Four requests of one revision merge it when they are traffic (the first test);
    as probes, beside base-model traffic only, nothing is merged."""
    hot = demo_assets.adapter("acme", "billing", "r1")
    hot_key = engine.adapter_key(hot.path)
    skewed = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY)] * 4 + [
        OfflineRequest(hot.probe_prompt, None, GREEDY)  # the base model: no revision to merge
    ]
    want = [r.token_ids for r in engine.generate(skewed)]
    made = engine._engine_request

    def probed(request: OfflineRequest, key: AdapterKey | None) -> Any:
        made_request = made(request, key)
        return replace(made_request, probe=True) if key == hot_key else made_request

    monkeypatch.setattr(engine, "_engine_request", probed)
    clock = ManualClock()
    control = controller(engine, "auto", clock, policy=replace(POLICY, payback_s=1e9))
    got = [r.token_ids for r in engine.generate(skewed, ticking(clock))]  # type: ignore[arg-type]
    got += [r.token_ids for r in engine.generate(skewed, ticking(clock))]  # type: ignore[arg-type]
    assert got == want + want
    assert control.switcher.merged_revision is None and control.transitions == []
    assert control.window.share(clock.now()).top_revision != ref_of(hot_key)
    assert control.lora_cost.measured  # the probes' LoRA work is still timed
    engine.runtime.cache.check_integrity()


def test_a_release_probe_counts_in_no_request_rate(
    engine: OfflineEngine, demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release's probes are no tenant's demand in the adapter cache either: counted in its
    request rates, a release's 32 probes ranked the candidate as hot for eviction and, asked as
    the owner, counted toward an automatic warm seat (attack27's noticed item). Traffic counts."""
    hot = demo_assets.adapter("acme", "billing", "r1")
    hot_key = engine.adapter_key(hot.path)
    made = engine._engine_request

    def probed(request: OfflineRequest, key: AdapterKey | None) -> Any:
        return replace(made(request, key), probe=True)

    cache = engine.runtime.cache
    monkeypatch.setattr(engine, "_engine_request", probed)
    engine.generate([OfflineRequest(hot.probe_prompt, hot.path, GREEDY)] * 3)
    history = cache._state.history_of(hot_key)
    now = cache._clock.now()
    assert history.rates.rates(now) == history.owner_rates.rates(now) == ZERO_RATES
    monkeypatch.setattr(engine, "_engine_request", made)
    engine.generate([OfflineRequest(hot.probe_prompt, hot.path, GREEDY)] * 3)
    now = cache._clock.now()
    assert history.rates.rates(now).per_1m > 0 and history.owner_rates.rates(now).per_1m > 0


def test_an_idle_gap_keeps_the_merge_for_the_traffic_that_returns(
    engine: OfflineEngine, demo_assets: DemoAssets
) -> None:
    """After an idle gap longer than ``window_s``, the merged revision's own traffic comes back.
    On main the first step after the gap read an empty window, the merged share as 0, and
    unmerged before that traffic ran (``min_dwell_s`` then kept it unmerged). One revision's
    traffic only: which revision ``auto`` merges does not hang on when another's load lands."""
    hot = demo_assets.adapter("acme", "billing", "r1")
    alone = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY)] * 4
    want = [r.token_ids for r in engine.generate(alone)]  # unmerged
    clock = ManualClock()
    control = controller(engine, "auto", clock, policy=replace(POLICY, payback_s=1e9))
    assert [r.token_ids for r in engine.generate(alone, ticking(clock))] == want  # type: ignore[arg-type]
    ref = ref_of(engine.adapter_key(hot.path))
    assert control.switcher.merged_revision == ref
    clock.advance(POLICY.window_s + POLICY.min_dwell_s + 30.0)  # idle
    assert [r.token_ids for r in engine.generate(alone, ticking(clock))] == want  # type: ignore[arg-type]
    assert control.switcher.merged_revision == ref
    assert [t.kind for t in control.transitions] == [TransitionKind.MERGE]
    control.close()
    engine.runtime.cache.check_integrity()
