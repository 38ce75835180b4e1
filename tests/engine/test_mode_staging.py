"""A staged merge in the real engine (engine/modes.py, engine/mode_control.py): the merged
weights are built a budgeted piece per step boundary while the revision is served unmerged,
then one boundary commits; requests in flight get the greedy tokens they get unmerged; a
refusal, a hold at the commit, a dedication of another revision, traffic that moved and
``close()`` each abandon the staging with nothing live changed and the lease released."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_kit import publish
from safetensors.torch import load_file, save_file

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.engine import modes
from loraplex.engine.config import EngineConfig
from loraplex.engine.factory import AdapterRuntimeConfig, build_adapter_runtime, build_engine_core
from loraplex.engine.mode_control import ModeController, ref_of
from loraplex.engine.mode_policy import ModePolicyConfig, ModeSetting
from loraplex.engine.modes import ModeSwitcher, Transition, TransitionKind
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.model.lora import LoraSlotPool
from loraplex.residency.cache.jobs import Lease
from loraplex.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
MODULE_S = 0.003  # one staged module's cost on the fake clock
BUDGET_S = 0.010  # three modules per boundary
POLICY = ModePolicyConfig(
    window_s=5.0,
    min_dwell_s=3.0,
    payback_s=1e9,
    min_measured_steps=3,
    min_window_tokens=1,
    merge_step_budget_s=BUDGET_S,
)


@pytest.fixture(scope="module")
def engine(demo_assets: DemoAssets) -> Iterator[OfflineEngine]:
    config = OfflineConfig(max_loras=3, max_lora_rank=64)
    with OfflineEngine(demo_assets.base_model_dir, config) as offline:
        yield offline


@pytest.fixture
def clock(engine: OfflineEngine) -> Iterator[ManualClock]:
    """Each staged module costs ``MODULE_S`` on this clock; the engine's own mode is restored."""
    clock = ManualClock()
    model = engine.core.runner.model
    pack = model.pack

    def costed(weight: torch.Tensor) -> bool:
        clock.advance(MODULE_S)
        return pack(weight)

    model.pack = costed  # type: ignore[method-assign]
    yield clock
    del model.pack
    if engine.core.modes is not None:
        engine.core.modes.close()
        engine.core.modes = None
    engine.runtime.cache.check_integrity()


def weights_now(engine: OfflineEngine) -> dict[str, torch.Tensor]:
    return dict(engine.core.runner.model.named_parameters())


def unchanged(engine: OfflineEngine, before: dict[str, torch.Tensor]) -> bool:
    """The live parameters are the very objects of ``before`` (nothing swapped or written)."""
    return all(p is before[n] for n, p in weights_now(engine).items())


def tracked(lease: Lease) -> tuple[Lease, list[int]]:
    released: list[int] = []
    release = lease.release

    def counted() -> None:
        released.append(1)
        release()

    lease.release = counted  # type: ignore[method-assign]
    return lease, released


def test_greedy_tokens_are_identical_across_a_staged_merge_and_an_unmerge(
    engine: OfflineEngine, demo_assets: DemoAssets, clock: ManualClock
) -> None:
    hot = demo_assets.adapter("acme", "billing", "r1")
    other = demo_assets.adapter("globex", "codegen", "r1")
    batch = [
        OfflineRequest(hot.probe_prompt, hot.path, GREEDY),
        OfflineRequest(other.probe_prompt, other.path, GREEDY),
        OfflineRequest(hot.probe_prompt, None, GREEDY),
    ]
    want = [r.token_ids for r in engine.generate(batch)]
    before = weights_now(engine)
    seen: list[Transition] = []
    pool = engine.runtime.pool
    switcher = ModeSwitcher(engine.core.runner, pool, clock, seen.append)
    key = engine.adapter_key(hot.path)
    lora_during: list[type] = []

    def between_steps(step: int) -> None:
        if step == 1:
            lease = engine.runtime.cache.acquire_future(key).result(60)
            assert switcher.begin("acme/billing@r1", lease)
        if switcher.staging_revision is not None:
            assert unchanged(engine, before)  # staging writes nothing live
            lora_during.append(type(engine.core.runner.lora))
            switcher.advance(BUDGET_S)
        elif switcher.merged_revision is not None and step == 18:
            switcher.unmerge()

    got = [r.token_ids for r in engine.generate(batch, between_steps)]
    assert got == want
    (merge, unmerge) = seen
    assert (merge.kind, unmerge.kind) == (TransitionKind.MERGE, TransitionKind.UNMERGE)
    assert merge.staging_steps == len(lora_during) > 2  # spread over several boundaries
    assert set(lora_during) == {LoraSlotPool}  # served unmerged while staging
    assert merge.staging_s >= merge.staging_steps * MODULE_S
    assert unchanged(engine, before)  # the unmerge swapped the very originals back


def test_the_budget_setting_bounds_the_staging_per_boundary(
    engine: OfflineEngine, demo_assets: DemoAssets, clock: ManualClock
) -> None:
    """``merged:<ref>`` with ``merge_step_budget_s``: the controller stages about the budget at
    each boundary (3 modules of 3 ms in 10 ms), the report says "staging" until the commit."""
    hot = demo_assets.adapter("acme", "billing", "r1")
    ref = ref_of(engine.adapter_key(hot.path))
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock)
    control = ModeController(ModeSetting.parse(f"merged:{ref}"), switcher, engine.runtime.cache,
                             clock, policy=POLICY)  # fmt: skip
    engine.core.modes = control
    staged: list[int] = []
    reports: list[str | None] = []

    def between_steps(_step: int) -> None:
        staging = switcher._staging
        if staging is not None and staging.staging is not None:
            staged.append(staging.staging.num_staged)
        reports.append(control.report.staging_revision)

    engine.generate([OfflineRequest(hot.probe_prompt, hot.path, GREEDY)], between_steps)
    (merge,) = control.transitions
    modules = len(switcher._merger._swapped.modules)  # type: ignore[union-attr]
    assert merge.staging_steps == -(-modules // 3)
    assert all(b - a == 3 for a, b in itertools.pairwise(staged))
    assert ref in reports and reports[-1] is None  # "staging", then merged
    assert control.report.merged_revision == ref
    assert control.report.staging.num_observed == 1


def test_a_refusal_mid_staging_changes_nothing_live_and_releases_the_lease(
    engine: OfflineEngine, demo_assets: DemoAssets, clock: ManualClock, tmp_path: Path
) -> None:
    hot = demo_assets.adapter("acme", "billing", "r1")
    poisoned = tmp_path / "poisoned"
    shutil.copytree(hot.path, poisoned)
    weights = poisoned / "adapter_model.safetensors"
    tensors = load_file(weights)  # only the last layer's deltas swamp: staged after the others
    last = max(int(k.split("layers.")[1].split(".")[0]) for k in tensors)
    save_file({k: v * 1e5 if f"layers.{last}." in k else v for k, v in tensors.items()}, weights)
    key = engine.adapter_key(poisoned)
    before = weights_now(engine)
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock)
    lease, released = tracked(engine.runtime.cache.acquire_future(key).result(60))
    assert switcher.begin(ref_of(key), lease)
    assert switcher.advance(BUDGET_S) is None and switcher.staging_revision == ref_of(key)
    while switcher.staging_revision is not None:
        assert switcher.advance(BUDGET_S) is None
    assert released == [1] and ref_of(key) in switcher.refused
    assert unchanged(engine, before) and engine.core.runner.lora is engine.runtime.pool
    again = engine.runtime.cache.acquire_future(key).result(60)
    assert not switcher.begin(ref_of(key), again)  # never staged again


@pytest.mark.parametrize("why", ["close", "dedicated", "traffic", "held"])
def test_a_staging_no_longer_wanted_is_abandoned(
    engine: OfflineEngine, demo_assets: DemoAssets, clock: ManualClock, why: str
) -> None:
    hot = demo_assets.adapter("acme", "billing", "r1")
    cold = demo_assets.adapter("globex", "codegen", "r1")
    ref, cold_ref = ref_of(engine.adapter_key(hot.path)), ref_of(engine.adapter_key(cold.path))
    before = weights_now(engine)
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock)
    control = ModeController(ModeSetting.parse("auto"), switcher, engine.runtime.cache, clock,
                             policy=POLICY)  # fmt: skip
    engine.core.modes = control
    leases: list[list[int]] = []
    begin = switcher.begin

    def tracked_begin(revision: str, lease: Lease) -> bool:
        lease, released = tracked(lease)
        leases.append(released)
        return begin(revision, lease)

    switcher.begin = tracked_begin  # type: ignore[method-assign]
    acted: list[bool] = []

    def between_steps(_step: int) -> None:
        clock.advance(1.0)
        if acted and why == "traffic":  # the traffic stays moved
            control.window.record(clock.now(), cold_ref, 100_000)
        if switcher.staging_revision is None or acted:
            return
        acted.append(True)
        if why == "close":
            control.close()
            assert control.report.staging_revision is None
            engine.core.modes = None  # closed: the engine is going away
        elif why == "dedicated":
            switcher.holds.dedicate(cold_ref)
        elif why == "traffic":  # the hot revision's share falls below unmerge_share
            control.window.record(clock.now(), cold_ref, 100_000)
        else:
            switcher.holds.hold(frozenset({ref}))

    skewed = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY)] * 4 + [
        OfflineRequest(cold.probe_prompt, cold.path, GREEDY)
    ]
    want = [r.token_ids for r in engine.generate(skewed)]
    got = [r.token_ids for r in engine.generate(skewed, between_steps)]  # type: ignore[arg-type]
    assert acted and got == want
    assert leases[0] == [1]  # the abandoned staging's lease, released once
    # the hot revision never committed (traffic moved or a dedication may merge the cold one)
    assert all(t.revision != ref for t in control.transitions)
    assert switcher.merged_revision != ref
    if why in ("close", "held"):
        assert control.transitions == [] and unchanged(engine, before)
    switcher.holds.release(frozenset({ref}))
    switcher.holds.dedicate(None)


def test_the_engine_config_budget_reaches_the_controller(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    store, refs = publish(demo_assets, base, tmp_path / "store")
    runtime = build_adapter_runtime(
        base, refs.__getitem__, store, tmp_path / "l2", AdapterRuntimeConfig(max_loras=2)
    )
    config = EngineConfig(mode="auto", merge_step_budget_s=0.03)
    core = build_engine_core(demo_assets.base_model_dir, config, runtime)
    try:
        assert core.modes is not None and core.modes.policy.merge_step_budget_s == 0.03
    finally:
        core.close()
    with pytest.raises(ValueError, match=r"^merge_step_budget_s 0 is invalid; expected > 0"):
        EngineConfig(mode="auto", merge_step_budget_s=0)
    with pytest.raises(ValueError, match=r"^merge_step_budget_s 0\.03 is set while mode is unm"):
        EngineConfig(merge_step_budget_s=0.03)


def test_an_unmerge_leaves_the_arena_to_the_boundaries_after_it(
    engine: OfflineEngine,
    demo_assets: DemoAssets,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unmerge frees none of the merged weights' arena inside the slot lock (freed at once,
    the large preset's held the steps 23-37 ms, 1.2-1.4 ms before the arena); each step boundary
    after it (``ModeController.before_step``) frees at most ``ARENA_RELEASE_BYTES``, and the
    requests in flight get the same greedy tokens."""
    budget = 2 << 20  # the small preset's arena (about 13 MiB) in 7 boundaries
    monkeypatch.setattr(modes, "ARENA_RELEASE_BYTES", budget)
    hot = demo_assets.adapter("acme", "billing", "r1")
    batch = [OfflineRequest(hot.probe_prompt, hot.path, GREEDY)]
    want = [r.token_ids for r in engine.generate(batch)]
    switcher = ModeSwitcher(engine.core.runner, engine.runtime.pool, clock)
    control = ModeController(ModeSetting.parse("auto"), switcher, engine.runtime.cache, clock,
                             policy=POLICY)  # fmt: skip
    releases = switcher._merger.releases
    key = engine.adapter_key(hot.path)
    pending: list[int] = []

    def between_steps(step: int) -> None:
        if step == 1:
            lease = engine.runtime.cache.acquire_future(key).result(60)
            switcher.merge("acme/billing@r1", lease)
        elif step == 3:
            switcher.unmerge()
            pending.append(releases.pending_bytes)
        elif step > 3:
            control.before_step()  # what the engine runs at each boundary
            pending.append(releases.pending_bytes)

    got = [r.token_ids for r in engine.generate(batch, between_steps)]
    assert got == want
    assert pending[0] > 4 * budget  # the unmerge freed nothing of it
    freed = [a - b for a, b in itertools.pairwise(pending)]
    assert all(0 <= piece <= budget for piece in freed) and pending[-1] == 0
    control.close()
