"""A request's life inside the engine: its state machine and mutable progress (torch-free).

    WAITING ──▶ RUNNING ──▶ FINISHED
      │  ▲         │
      ▼  │         └──▶ WAITING (preempted: KV freed, recomputed later; the lease is kept;
    ADAPTER_WAIT              paused: the lease released, the KV kept or freed, sched/kept_kv)
    any live state ──▶ ABORTED (client abort, deadline, adapter load failure)

A WAITING request whose adapter is not leased yet is not schedulable; it moves to ADAPTER_WAIT
while the cache loads the adapter in the background, and back to WAITING with its lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from loraplex.engine.protocol import EngineRequest
from loraplex.engine.trace_log import TraceLog


class RequestState(Enum):
    WAITING = "waiting"  # queued; schedulable once its adapter is leased (or it has none)
    ADAPTER_WAIT = "adapter_wait"  # queued; its adapter is loading
    RUNNING = "running"  # holds KV blocks; prefilling or decoding
    FINISHED = "finished"  # stop / length
    ABORTED = "aborted"  # client abort, deadline or load failure


QUEUED_STATES = frozenset({RequestState.WAITING, RequestState.ADAPTER_WAIT})

_LEGAL: dict[RequestState, frozenset[RequestState]] = {
    RequestState.WAITING: frozenset(
        {RequestState.ADAPTER_WAIT, RequestState.RUNNING, RequestState.ABORTED}
    ),
    RequestState.ADAPTER_WAIT: frozenset({RequestState.WAITING, RequestState.ABORTED}),
    RequestState.RUNNING: frozenset(
        {RequestState.WAITING, RequestState.FINISHED, RequestState.ABORTED}
    ),
    RequestState.FINISHED: frozenset(),
    RequestState.ABORTED: frozenset(),
}


class IllegalTransitionError(RuntimeError):
    """An engine bug: a request was moved along an edge the state machine does not have."""


class HeldLease(Protocol):
    """What the engine needs of a cache lease (``loraplex.residency.cache.jobs.Lease``)."""

    @property
    def slot(self) -> int: ...

    def release(self) -> None: ...


@dataclass(eq=False)
class Request:
    """Mutable engine-side progress of one EngineRequest (owned by the engine thread)."""

    request: EngineRequest  # what the client asked for
    arrival_s: float  # clock time of admission to the engine
    deadline_at_s: float  # clock time past which a queued request times out
    state: RequestState = RequestState.WAITING  # see the module docstring
    output_token_ids: list[int] = field(default_factory=list)  # sampled tokens so far
    num_computed_tokens: int = 0  # tokens whose keys/values are in the KV cache
    seq_id: int | None = None  # KV sequence handle while RUNNING (or kept across a pause)
    # tokens it had computed when a pause freed its KV (not kept, or kept and freed for other
    # work): its resume recomputes them, less a prefix-cache hit (counted at its admission)
    num_lost_tokens: int = 0
    lease: HeldLease | None = None  # adapter slot lease (None: base model or not yet leased)
    finish_reason: str | None = None  # set on FINISHED/ABORTED
    first_scheduled_s: float | None = None  # when it first ran (queue wait = this - arrival)
    trace_log: TraceLog | None = None  # its stages when traced (``EngineRequest.traceparent``)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant(self) -> str:
        return self.request.tenant

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.request.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self) -> list[int]:
        return [*self.request.prompt_token_ids, *self.output_token_ids]

    @property
    def adapter_ready(self) -> bool:
        """Schedulable as far as the adapter goes: base model, or its lease is held."""
        return self.request.adapter_key is None or self.lease is not None

    @property
    def slot(self) -> int | None:
        return None if self.lease is None else self.lease.slot

    def transition(self, new: RequestState) -> None:
        if new not in _LEGAL[self.state]:
            raise IllegalTransitionError(
                f"request {self.request_id!r}: {self.state.value} -> {new.value} is not legal"
            )
        self.state = new
