"""A torch-free driver for the scheduler: the engine core's calls with a set of resident adapters
standing in for the cache (its leases are fakes), fake sampling, deterministic steps."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.protocol import FINISH_ABORT, FINISH_LENGTH, EngineRequest
from loraplex.engine.request import Request, RequestState
from loraplex.engine.sched.admission import AdapterLoads
from loraplex.engine.sched.scheduler import Scheduler
from loraplex.engine.step import StepPlan, StepResult
from loraplex.engine.tenant_shares import TenantBook
from loraplex.sampling import SamplingParams

BASE = hashlib.sha256(b"base").hexdigest()


def adapter(name: str, tenant: str = "t") -> AdapterKey:
    return AdapterKey(BASE, tenant, name, "r1", hashlib.sha256(name.encode()).hexdigest())


@dataclass
class FakeLease:
    slot: int
    released: bool = False

    def release(self) -> None:
        self.released = True


def request(
    rid: str,
    tenant: str = "a",
    *,
    prompt: int = 4,
    out: int = 3,
    key: AdapterKey | None = None,
    deadline_s: float | None = None,
    first: int = 1,
) -> EngineRequest:
    return EngineRequest(
        rid,
        tenant,
        key,
        tuple(range(first, first + prompt)),
        SamplingParams(max_tokens=out),
        deadline_s,
    )


@dataclass
class Driver:
    """Steps a Scheduler like the engine core does, through the scheduler's own lease methods;
    adapters in ``resident`` are hits (leased at once), the others load until ``load``."""

    config: SchedulerConfig
    num_blocks: int = 64
    block_size: int = 4
    clock: ManualClock = field(default_factory=ManualClock)
    resident: set[AdapterKey] = field(default_factory=set)
    tenants: TenantBook = field(default_factory=TenantBook)
    leases: list[FakeLease] = field(default_factory=list)  # every lease handed out
    tokens_by_tenant: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    plans: list[StepPlan] = field(default_factory=list)
    decodes_first: bool = False  # plan by schedule_decodes() where it plans (the simulator's way)
    num_decode_plans: int = 0  # plans schedule_decodes() made

    def __post_init__(self) -> None:
        self.blocks = BlockManager(self.num_blocks, self.block_size)
        self.scheduler = Scheduler(self.config, self.blocks, self.clock, self.tenants)

    def add(self, engine_request: EngineRequest) -> Request:
        return self.scheduler.add(engine_request)

    def loads(self) -> AdapterLoads:
        return AdapterLoads(self.resident.__contains__)

    def lease(self, slot: int) -> FakeLease:
        self.leases.append(FakeLease(slot))
        return self.leases[-1]

    def grant_leases(self) -> list[Request]:
        """The lease window asks for its leases; returns the requests that asked."""
        asked = self.scheduler.lease_candidates(self.loads())
        for req in asked:
            if req.request.adapter_key in self.resident:
                self.scheduler.on_lease(req, self.lease(hash(req.request.adapter_key) % 8))
            else:
                self.scheduler.wait_for_adapter(req)
        return asked

    def load(self, key: AdapterKey) -> None:
        """The adapter finished loading: waiting requests get leases."""
        self.resident.add(key)
        for req in list(self.scheduler.requests.values()):
            if req.state is RequestState.ADAPTER_WAIT and req.request.adapter_key == key:
                self.scheduler.on_lease(req, self.lease(1))

    def step(self) -> StepPlan:
        for req in self.scheduler.expired(self.clock.now()):
            self.scheduler.finish(req, RequestState.ABORTED, FINISH_ABORT)
            self.expired.append(req.request_id)
        self.grant_leases()
        plan = self.scheduler.schedule_decodes() if self.decodes_first else None
        self.num_decode_plans += plan is not None
        plan = plan or self.scheduler.schedule()
        self.plans.append(plan)
        for c in plan.chunks:  # every scheduled token has a KV position
            table = self.blocks.block_table(c.seq_id)
            assert len(table) * self.block_size >= c.start_pos + len(c.token_ids)
        sampled = {c.request_id: 7 for c in plan.chunks if c.samples}
        for c in plan.chunks:
            tenant = self.scheduler.requests[c.request_id].tenant
            self.tokens_by_tenant[tenant] = self.tokens_by_tenant.get(tenant, 0) + len(c.token_ids)
        self.scheduler.update(plan, StepResult(sampled, {}))
        for rid in sampled:
            req = self.scheduler.requests[rid]
            if len(req.output_token_ids) >= req.request.params.max_tokens:
                self.scheduler.finish(req, RequestState.FINISHED, FINISH_LENGTH)
                self.finished.append(rid)
        self.clock.advance(0.01)
        return plan
