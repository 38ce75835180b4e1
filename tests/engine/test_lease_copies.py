"""A lease whose adapter is in host memory (L1), so only its copy into a slot is left, is waited
for before the step plans (at most ``lease_desk.MAX_COPY_WAIT_S``): its request runs in the step
that asked for the lease instead of sitting that step out. A copy that cannot finish in time
leaves its request in ADAPTER_WAIT, collected in a later step as any load is."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_kit import gated_runtime

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.core import EngineCore
from loraplex.engine.factory import build_engine_core
from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.request import RequestState
from loraplex.residency.cache import TieredAdapterCache
from loraplex.residency.ledger import Tier
from loraplex.sampling import SamplingParams

DEADLINE_S = 60.0  # liveness bound on running one short request out (a bug fails, never hangs)


@dataclass
class Rig:
    core: EngineCore
    cache: TieredAdapterCache
    slot_lock: threading.Lock
    key: AdapterKey
    tenant: str
    out: dict[str, list[TokenDelta | BaseException]]
    woke: threading.Event  # set when a lease's load completes (the engine loop's wake)

    def add(self, rid: str) -> None:
        ids = tuple(self.core.tokenizer.encode("The acme team"))
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        request = EngineRequest(rid, self.tenant, self.key, ids, params, stages=True)
        self.core.add(request, self.out.setdefault(rid, []).append)

    def tokens(self, rid: str) -> int:
        return sum(len(d.token_ids) for d in self.out[rid] if isinstance(d, TokenDelta))

    def state(self, rid: str) -> RequestState:
        return self.core.scheduler.requests[rid].state

    def run_out(self, rid: str) -> None:
        """Steps until ``rid`` ended, sleeping until woken when nothing ran (as the loop does)."""
        deadline = time.monotonic() + DEADLINE_S
        while rid in self.core.scheduler.requests:
            assert time.monotonic() < deadline, f"{rid} did not finish"
            if not self.core.step():
                self.woke.wait(0.2)
                self.woke.clear()


def _build(assets: DemoAssets, root: Path, **sched: int) -> Rig:
    """An engine core on a gated runtime of 2 slots, over the first demo adapter."""
    runtime, _ = gated_runtime(assets, root, max_loras=2, tenant_max_concurrent_loads=2)
    scheduler = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, **sched
    )
    config = EngineConfig(scheduler=scheduler, block_size=8, num_kv_blocks=64)
    core = build_engine_core(assets.base_model_dir, config, runtime, clock=ManualClock())
    adapter = assets.adapters[0]
    key = adapter.key(BaseModelSpec.from_dir(assets.base_model_dir).digest)
    woke = threading.Event()
    core.on_lease_done = woke.set
    return Rig(core, runtime.cache, runtime.slot_lock, key, adapter.tenant, {}, woke)


@pytest.fixture
def rig(demo_assets: DemoAssets, tmp_path: Path) -> Iterator[Rig]:
    built = _build(demo_assets, tmp_path)
    cache, key = built.cache, built.key
    cache.prefetch(key, Tier.L1).result(timeout=60)  # in host memory, in no slot
    assert cache.is_resident(key, Tier.L1) and not cache.is_resident(key, Tier.L0)
    yield built
    built.core.close()
    cache.close()


def test_a_copy_from_host_memory_runs_in_the_step_that_asked_for_it(rig: Rig) -> None:
    rig.add("copied")
    assert rig.core.step()  # the lease came within the step: its prompt ran in it
    assert rig.tokens("copied") == 1
    assert rig.cache.is_resident(rig.key, Tier.L0)
    rig.run_out("copied")
    assert rig.tokens("copied") == 4
    rig.core.check_integrity()


def test_a_copy_that_cannot_finish_leaves_its_request_waiting(rig: Rig) -> None:
    rig.add("held")
    with rig.slot_lock:  # the copy into a slot needs it: it cannot finish while held here
        assert not rig.core.step()  # the step did not wait for it past its bound
        assert rig.state("held") is RequestState.ADAPTER_WAIT
        assert rig.tokens("held") == 0
    rig.run_out("held")  # the copy finishes; a later step collects the lease
    assert rig.tokens("held") == 4
    rig.core.check_integrity()


def _charged(rig: Rig, tier: Tier) -> str:
    entry = rig.cache.ledgers[tier].get(rig.key)
    assert entry is not None
    return entry.charged


def test_a_lease_is_charged_to_the_requests_tenant_then_to_the_owners(rig: Rig) -> None:
    """The lease desk names the request's tenant to the cache: another tenant's request (a call
    of a public adapter) loads the GPU copy on its own share; the owner's request takes the
    charge back (docs/registry.md, "Resolution")."""
    owner, caller = rig.tenant, f"not-{rig.tenant}"
    assert _charged(rig, Tier.L1) == owner  # the fixture's prefetch: no requester
    rig.tenant = caller
    rig.add("caller")
    rig.run_out("caller")
    ledger = rig.cache.ledgers[Tier.L0]
    assert _charged(rig, Tier.L0) == caller and owner not in ledger.tenant_bytes
    assert _charged(rig, Tier.L1) == owner  # no load of the caller's filled it
    rig.tenant = owner
    rig.add("owner")
    rig.run_out("owner")
    assert _charged(rig, Tier.L0) == owner and caller not in ledger.tenant_bytes
    rig.core.check_integrity()


@pytest.fixture
def window_rig(demo_assets: DemoAssets, tmp_path: Path) -> Iterator[Rig]:
    """A lease window of one adapter; nothing loaded."""
    built = _build(demo_assets, tmp_path, lease_lookahead=1, prefetch_lookahead=4)
    yield built
    built.core.close()
    built.cache.close()


def test_the_prefetch_window_charges_the_queued_requests_tenant(
    window_rig: Rig, demo_assets: DemoAssets
) -> None:
    """A caller's queued request just past the lease window (of one adapter) has its adapter
    prefetched to host memory on the caller's share, as its lease will be; with no requester
    named (before), that copy was the owner's."""
    rig = window_rig
    digest = BaseModelSpec.from_dir(demo_assets.base_model_dir).digest
    later = demo_assets.adapters[1].key(digest)
    caller = f"not-{rig.key.tenant}-{later.tenant}"
    rig.tenant = caller
    rig.add("first")  # the lease window: rig.key
    rig.key = later
    rig.add("later")  # past it: prefetched
    rig.core.step()
    deadline = time.monotonic() + DEADLINE_S
    while not rig.cache.is_resident(later, Tier.L1):
        assert time.monotonic() < deadline, "the prefetch did not finish"
        time.sleep(0.01)
    assert _charged(rig, Tier.L1) == caller
    assert later.tenant not in rig.cache.ledgers[Tier.L1].tenant_bytes
    rig.run_out("first")
    rig.run_out("later")
    assert _charged(rig, Tier.L0) == caller
    rig.core.check_integrity()
