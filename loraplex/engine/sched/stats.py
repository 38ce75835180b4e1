"""The scheduler's published counts (``Scheduler.make_stats``), read by other threads."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.mode_report import ModeReport
from loraplex.engine.protocol import EngineLoad
from loraplex.engine.request import QUEUED_STATES, Request, RequestState


@dataclass(frozen=True)
class QueueView:
    """The scheduler's counts, published by the engine thread after each step."""

    num_waiting: int  # queued and schedulable once admitted (base model or leased)
    num_adapter_wait: int  # queued behind an adapter load (or a lease not yet requested)
    num_running: int  # holding KV blocks
    kv_usage: float  # fraction of KV blocks in use
    queued_adapters: tuple[AdapterKey, ...]  # adapters of queued requests without a lease
    num_active_tokens: int  # prompt + output tokens of every live request (queued or running)
    mode: ModeReport | None = None  # merged revision and transition times; None: unmerged
    num_paused: int = 0  # out of scheduling: their consumers stopped reading (Scheduler.pause)
    num_pauses: int = 0  # requests paused since the engine started (a counter)
    num_resumes: int = 0  # paused requests resumed since the engine started (a counter)
    num_pauses_kv_kept: int = 0  # pauses that kept their KV sequences (a counter)
    num_paused_kv_freed: int = 0  # kept sequences freed before they ran again (a counter)
    # tokens resumed requests computed again, their KV freed by or after their pause (a counter)
    num_resume_recomputed_tokens: int = 0
    # vLLM's ``lora_requests_info`` lists: the adapters of running requests, of queued ones
    # (leased or not; an adapter may be in both), in arrival order, each once
    lora_running: tuple[AdapterKey, ...] = ()
    lora_waiting: tuple[AdapterKey, ...] = ()


EMPTY_VIEW = QueueView(0, 0, 0, 0.0, (), 0)


@dataclass
class PauseCounts:
    """The scheduler's running totals of ``pause`` and ``resume`` (for /metrics' counters)."""

    num_pauses: int = 0  # requests taken out of scheduling
    num_resumes: int = 0  # paused requests put back
    num_kept: int = 0  # pauses that kept the request's KV sequence (``kept_kv``)
    num_kept_dropped: int = 0  # kept sequences freed before their requests ran again
    num_recomputed_tokens: int = 0  # tokens resumed requests computed again (KV not kept)


def queue_view(
    requests: Iterable[Request],
    num_running: int,
    kv_usage: float,
    paused: Container[str] = (),
    pauses: PauseCounts | None = None,
) -> QueueView:
    """The view of the live ``requests`` (those in ``paused`` are counted apart: not queued;
    ``pauses``: how many pauses and resumes there were so far)."""
    pauses = pauses or PauseCounts()
    live = list(requests)
    queued = [r for r in live if r.state in QUEUED_STATES and r.request_id not in paused]
    waiting = sum(r.adapter_ready for r in queued)
    keys = (r.request.adapter_key for r in queued if not r.adapter_ready)
    running = (r for r in live if r.state is RequestState.RUNNING and r.request_id not in paused)
    return QueueView(
        num_waiting=waiting,
        num_adapter_wait=len(queued) - waiting,
        num_running=num_running,
        kv_usage=kv_usage,
        queued_adapters=_adapters(keys),
        num_active_tokens=sum(r.num_tokens for r in live),
        num_paused=sum(r.request_id in paused for r in live),
        num_pauses=pauses.num_pauses,
        num_resumes=pauses.num_resumes,
        num_pauses_kv_kept=pauses.num_kept,
        num_paused_kv_freed=pauses.num_kept_dropped,
        num_resume_recomputed_tokens=pauses.num_recomputed_tokens,
        lora_running=_adapters(r.request.adapter_key for r in running),
        lora_waiting=_adapters(r.request.adapter_key for r in queued),
    )


def _adapters(keys: Iterable[AdapterKey | None]) -> tuple[AdapterKey, ...]:
    """The distinct adapters among ``keys`` (None: the base model), first seen first."""
    return tuple(dict.fromkeys(k for k in keys if k is not None))


def load_of(view: QueueView, running: tuple[AdapterKey, ...], max_loras: int) -> EngineLoad:
    """The engine's load as the server reports it: ``view`` plus the adapters in GPU slots
    (``running``); an adapter in a slot is never also listed as waiting."""
    resident = set(running)
    return EngineLoad(
        num_waiting=view.num_waiting,
        num_adapter_wait=view.num_adapter_wait,
        num_running=view.num_running,
        kv_usage=view.kv_usage,
        running_adapters=running,
        waiting_adapters=tuple(k for k in view.queued_adapters if k not in resident),
        max_loras=max_loras,
        num_active_tokens=view.num_active_tokens,
        mode=view.mode,
        num_paused=view.num_paused,
        num_pauses=view.num_pauses,
        num_resumes=view.num_resumes,
        num_pauses_kv_kept=view.num_pauses_kv_kept,
        num_paused_kv_freed=view.num_paused_kv_freed,
        num_resume_recomputed_tokens=view.num_resume_recomputed_tokens,
        lora_running=view.lora_running,
        lora_waiting=view.lora_waiting,
    )
