"""The engine core's errors name what went wrong: permanent (a prompt that can never fit, an
adapter asked of a base-only engine) apart from transient (shutting down: unavailable)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.core import EngineCore
from loraplex.engine.factory import build_engine_core
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.errors import (
    CapacityError,
    EngineUnavailableError,
    NoAdapterCacheError,
    PromptTooLongError,
    UnservableError,
)
from loraplex.sampling import SamplingParams

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def base_only(demo_assets: DemoAssets) -> Iterator[EngineCore]:
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN)
    config = EngineConfig(scheduler=sched, block_size=8, num_kv_blocks=64)
    core = build_engine_core(demo_assets.base_model_dir, config, None)
    yield core
    core.close()


def _request(rid: str, *, prompt: int = 4, key: AdapterKey | None = None) -> EngineRequest:
    return EngineRequest(rid, "t", key, tuple(range(3, 3 + prompt)), SamplingParams(max_tokens=2))


def test_a_prompt_that_can_never_fit_is_permanent(base_only: EngineCore) -> None:
    received: list[TokenDelta | BaseException] = []
    with pytest.raises(PromptTooLongError, match=f"max_model_len is {MAX_MODEL_LEN}"):
        base_only.add(_request("long", prompt=MAX_MODEL_LEN), received.append)
    assert not received and "long" not in base_only.scheduler.requests


def test_a_base_only_engine_refuses_adapters_permanently(
    base_only: EngineCore, demo_assets: DemoAssets
) -> None:
    with pytest.raises(NoAdapterCacheError) as refused:
        key = demo_assets.adapters[0].key(demo_assets.base_digest)
        base_only.add(_request("lora", key=key), lambda _: None)
    assert isinstance(refused.value, UnservableError)
    assert not isinstance(refused.value, CapacityError)  # never a 429/503 to retry


def test_closing_ends_live_requests_as_unavailable(demo_assets: DemoAssets) -> None:
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    core = build_engine_core(demo_assets.base_model_dir, EngineConfig(scheduler=sched), None)
    received: list[TokenDelta | BaseException] = []
    core.add(_request("live"), received.append)
    core.close()
    assert len(received) == 1 and isinstance(received[0], EngineUnavailableError)
    assert not core.scheduler.requests and core.view.num_waiting == 0
