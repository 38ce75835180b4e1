"""What the engine core notes in traced requests' logs (``trace_log.TraceLog``): each step's
batch shape, each merge or unmerge they waited through, and the finished trace a last delta
carries. The core calls these only while some live request is traced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from loraplex.clock import Clock
from loraplex.engine.live import Live
from loraplex.engine.modes import Transition
from loraplex.engine.request import Request
from loraplex.engine.step import StepPlan
from loraplex.engine.trace_log import EngineTrace


def trace_transitions(lives: Iterable[Live], transitions: list[Transition], clock: Clock) -> None:
    """Notes each merge/unmerge in every live traced request's log (all of them waited)."""
    if not transitions:
        return
    now = clock.now()
    for live in lives:
        log = live.req.trace_log
        if log is None:
            continue
        for t in transitions:
            log.mode_transition(now, t.seconds, t.kind.value, t.revision)


def trace_batches(lives: Mapping[str, Live], plan: StepPlan, clock: Clock, strategy: str) -> None:
    """Notes this step's batch shape in each traced request's log (a few compares per traced
    request; nothing for the others)."""
    traced = [
        (c, log) for c in plan.chunks if (log := lives[c.request_id].req.trace_log) is not None
    ]
    if not traced:
        return
    now = clock.now()
    size = len(plan.chunks)
    num_revisions = len({c.slot for c in plan.chunks})
    for chunk, log in traced:
        if log.prefix_reused_tokens is None:  # its first chunk starts past the reused prefix
            log.prefix_reused_tokens = chunk.start_pos
        log.batch(now, size, num_revisions, strategy)


def trace_of(req: Request, clock: Clock) -> EngineTrace | None:
    """The finished trace of ``req`` (None: not traced)."""
    log = req.trace_log
    if log is None:
        return None
    first = req.first_scheduled_s
    queued = None if first is None else max(0.0, first - req.arrival_s)
    return log.finish(clock.now(), queued, req.request.adapter_key is None)
