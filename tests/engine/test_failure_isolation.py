"""A failing request fails alone: extreme sampling values and adapters with huge finite weights
share steps with other tenants' requests and never change their output or status."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from engine_kit import Stack, build_stack, probe_request, text_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from loraplex.artifacts.identity import sha256_file
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.protocol import FINISH_LENGTH, FINISH_STOP, EngineRequest, TokenDelta
from loraplex.engine.step import StepPlan
from loraplex.errors import GenerationError, QueueFullError
from loraplex.sampling import SamplingParams

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAdapter, DemoAssets

POISON_FACTORS = (3e37, -3e37, 1e30)


def _poisoned(adapter: DemoAdapter, root: Path, factor: float) -> DemoAdapter:
    """A copy of ``adapter`` whose LoRA weights are scaled by ``factor`` (finite, huge)."""
    name = f"{adapter.name}-poison{len(list(root.iterdir()))}"
    path = root / name
    shutil.copytree(adapter.path, path)
    weights = path / "adapter_model.safetensors"
    tensors = {k: (v.double() * factor).float() for k, v in load_file(weights).items()}
    assert all(bool(torch.isfinite(t).all()) for t in tensors.values())
    save_file(tensors, weights)
    return dataclasses.replace(adapter, name=name, path=path, digest=sha256_file(weights))


@pytest.fixture(scope="module")
def stack(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    poison_root = tmp_path_factory.mktemp("poison")
    victims = demo_assets.adapters[:4]
    poisoned = [_poisoned(victims[i % 2], poison_root, f) for i, f in enumerate(POISON_FACTORS)]
    assets = dataclasses.replace(demo_assets, adapters=(*victims, *poisoned))
    sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=256,
                            lease_lookahead=8, max_queue_len=64)  # fmt: skip
    built = build_stack(assets, tmp_path_factory.mktemp("iso"), max_loras=8, sched=sched)
    yield built
    built.close()


async def _outcome(stack: Stack, request: EngineRequest) -> tuple[list[TokenDelta], object]:
    deltas: list[TokenDelta] = []
    try:
        async for delta in stack.engine.generate(request):
            deltas.append(delta)
    except Exception as exc:
        return deltas, exc
    return deltas, None


def _run_all(stack: Stack, requests: list[EngineRequest]) -> list[tuple[list[TokenDelta], object]]:
    async def run() -> list[tuple[list[TokenDelta], object]]:
        return list(await asyncio.gather(*(_outcome(stack, r) for r in requests)))

    return asyncio.run(run())


def _victims(stack: Stack, tag: str) -> list[EngineRequest]:
    adapters = stack.assets.adapters[:4]
    return [probe_request(stack, a, f"{tag}-victim-{i}") for i, a in enumerate(adapters)]


def _assert_victims_untouched(stack: Stack, results: list[tuple[list[TokenDelta], object]]) -> None:
    for adapter, (deltas, error) in zip(stack.assets.adapters[:4], results, strict=False):
        assert error is None, (adapter.ref, error)
        assert text_of(deltas) == adapter.expected_continuation, adapter.ref
        assert deltas[-1].finish_reason in (FINISH_STOP, FINISH_LENGTH)


def test_huge_weights_fail_their_own_request_only(stack: Stack) -> None:
    poisoned = stack.assets.adapters[4:]
    attackers = [
        EngineRequest(
            f"poison-{i}",
            a.tenant,
            stack.key(a),
            tuple(stack.engine.tokenizer.encode(a.probe_prompt)),
            SamplingParams(max_tokens=8, temperature=t),
        )
        for i, (a, t) in enumerate(zip(poisoned, (0.0, 1.0, 0.7), strict=True))
    ]
    results = _run_all(stack, [*_victims(stack, "w"), *attackers])
    _assert_victims_untouched(stack, results[:4])
    for _, error in results[4:6]:  # the two 3e37 adapters overflow to inf: a clear error
        assert isinstance(error, GenerationError)
        assert "non-finite logits" in str(error)


def test_extreme_sampling_values_fail_or_run_alone(stack: Stack) -> None:
    prompt = tuple(stack.engine.tokenizer.encode("The acme"))
    extremes = [
        SamplingParams(max_tokens=6, temperature=1.0, top_p=1e-46),
        SamplingParams(max_tokens=6, temperature=1e-38),
        SamplingParams(max_tokens=6, temperature=2.0, top_p=1e-300, seed=-(2**63)),
        SamplingParams(max_tokens=6, temperature=1e-5, top_k=1, seed=2**63 - 1),
    ]
    attackers = [EngineRequest(f"x-{i}", "mallory", None, prompt, p) for i, p in
                 enumerate(extremes)]  # fmt: skip
    results = _run_all(stack, [*_victims(stack, "s"), *attackers])
    _assert_victims_untouched(stack, results[:4])
    greedy = _run_all(stack, [EngineRequest("g", "m", None, prompt, SamplingParams(max_tokens=6))])
    for deltas, error in results[4:]:  # each is greedy in effect: the top token always stays
        assert error is None
        assert text_of(deltas) == text_of(greedy[0][0])


def test_a_raising_step_fails_only_the_request_whose_part_raises(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = stack.engine._core.runner  # the engine thread's runner
    real_run = runner.run

    def run(plan: StepPlan, params: object, *rest: object) -> object:
        if any(c.request_id == "bomb" for c in plan.chunks):
            raise RuntimeError("secret attacker text")
        return real_run(plan, params, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "run", run)
    prompt = tuple(stack.engine.tokenizer.encode("The globex"))
    bomb = EngineRequest("bomb", "mallory", None, prompt, SamplingParams(max_tokens=4))
    results = _run_all(stack, [*_victims(stack, "r"), bomb])
    _assert_victims_untouched(stack, results[:4])
    error = results[4][1]
    assert isinstance(error, GenerationError)
    assert "secret attacker text" not in str(error)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    temperature=st.one_of(st.just(0.0), st.floats(0.0, 2.0), st.sampled_from([1e-45, 1e-38])),
    top_p=st.one_of(st.floats(1e-300, 1.0), st.sampled_from([5e-324, 1e-46, 1.0])),
    top_k=st.one_of(st.none(), st.integers(1, 100_000)),
    seed=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    poison=st.integers(0, len(POISON_FACTORS) - 1),
)
def test_random_attackers_never_change_victims(
    stack: Stack, temperature: float, top_p: float, top_k: int | None, seed: int | None,
    poison: int,
) -> None:  # fmt: skip
    params = SamplingParams(max_tokens=5, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed)  # fmt: skip
    adapter = stack.assets.adapters[4 + poison]
    prompt = tuple(stack.engine.tokenizer.encode(adapter.probe_prompt))
    attackers = [
        EngineRequest("a-poison", adapter.tenant, stack.key(adapter), prompt, params),
        EngineRequest("a-base", "mallory", None, prompt, params),
    ]
    results = _run_all(stack, [*_victims(stack, "p"), *attackers])
    _assert_victims_untouched(stack, results[:4])
    for deltas, error in results[4:]:
        assert error is None or isinstance(error, GenerationError)
        if error is None:
            assert deltas[-1].finish_reason is not None


def test_a_flooding_tenant_cannot_push_another_into_429(stack: Stack) -> None:
    prompt = tuple(stack.engine.tokenizer.encode("The initech"))
    params = SamplingParams(max_tokens=2)
    flood = [EngineRequest(f"flood-{i}", "flood", None, prompt, params) for i in range(90)]
    victims = [EngineRequest(f"calm-{i}", "calm", None, prompt, params) for i in range(20)]
    results = _run_all(stack, [*flood, *victims])
    assert all(error is None for _, error in results[90:])  # every victim request is served
    refused = [e for _, e in results[:90] if e is not None]
    assert refused and all(isinstance(e, QueueFullError) for e in refused)
