"""``RequestTrace``: what the front stamps while one request runs (torch-free, no OpenTelemetry).

The front stamps wall-clock nanoseconds (spans need epoch times); the engine's stages come back
as an ``EngineTrace`` of offsets from its own arrival, placed at the sibling's submission here.
A request with ``n`` > 1 choices has one sibling per choice; the trace ends when all did (or
when the request failed before reaching the engine) and is handed to ``on_done`` once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from loraplex.engine.protocol import TokenDelta
from loraplex.engine.trace_log import EngineTrace
from loraplex.tracing.context import SpanIds

# Why a span of a kept trace did not reach the receiver (``delivery.py``; metric labels).
DROP_REASONS = ("queue_full", "export_failed", "shutdown")


@dataclass(frozen=True)
class Interval:
    """A stage's wall-clock span."""

    start_ns: int
    end_ns: int


@dataclass
class Sibling:
    """One engine request of the trace (one choice)."""

    request_id: str  # the engine's request id
    submitted_ns: int  # handed to the engine
    first_token_ns: int | None = None  # its first token reached the front
    ended_ns: int | None = None  # its stream ended
    outcome: str | None = None  # finish reason, or "error"
    error_type: str | None = None  # the error's class name when it failed
    input_tokens: int = 0  # prompt tokens
    output_tokens: int = 0  # generated tokens
    engine: EngineTrace | None = None  # the engine's stages (its last delta's)
    verdict: str | None = None  # the release acceptance verdict for its revision; None: base

    def on_delta(self, delta: TokenDelta, now_ns: int) -> None:
        if delta.token_ids and self.first_token_ns is None:
            self.first_token_ns = now_ns
        self.input_tokens = delta.prompt_tokens
        self.output_tokens = delta.completion_tokens
        if delta.trace is not None:
            self.engine = delta.trace


@dataclass(frozen=True)
class Subject:
    """Who asked for what (exported hashed unless names are allowed)."""

    operation: str  # GenAI operation name: "chat" or "text_completion"
    model: str  # the ``model`` the client sent (an alias, a pinned revision or the base)
    tenant: str  # the tenant's name
    tenant_class: str  # its priority class


class RequestTrace:
    """One request's front-side record (owned by its handler's event loop)."""

    def __init__(
        self,
        ids: SpanIds,
        subject: Subject,
        start_ns: int,
        on_done: Callable[[RequestTrace], None],
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.ids = ids
        self.subject = subject
        self.start_ns = start_ns
        self.now_ns = now_ns
        self.authorization: Interval | None = None  # the key check and rate bucket
        self.resolution: Interval | None = None  # alias -> revision
        self.revision: str | None = None  # tenant/name@revision that answers; None: base
        self.arrival_tier: str | None = None  # where its adapter was on arrival
        self.siblings: list[Sibling] = []
        self.error_type: str | None = None  # a failure before the engine
        self.end_ns: int | None = None
        self._on_done = on_done

    @property
    def traceparent(self) -> str:
        return self.ids.traceparent()

    def resolved(
        self, start_ns: int, revision: str | None, tier: str | None, end_ns: int | None = None
    ) -> None:
        """The alias resolved to ``revision`` between ``start_ns`` and ``end_ns`` (None: now)."""
        self.resolution = Interval(start_ns, self.now_ns() if end_ns is None else end_ns)
        self.revision, self.arrival_tier = revision, tier

    def submit(self, request_id: str) -> Sibling:
        sibling = Sibling(request_id, self.now_ns())
        self.siblings.append(sibling)
        return sibling

    def sibling_ended(
        self, sibling: Sibling, outcome: str, error: BaseException | None, verdict: str | None
    ) -> None:
        if sibling.ended_ns is not None:
            return
        sibling.ended_ns = self.now_ns()
        sibling.outcome, sibling.verdict = outcome, verdict
        if error is not None:
            sibling.error_type = type(error).__name__
        elif outcome == "error":  # the stream ended without a last delta
            sibling.error_type = "StreamEnded"
        if all(s.ended_ns is not None for s in self.siblings):
            self._done()

    def failed(self, error: BaseException) -> None:
        """The request failed before (or while) reaching the engine: ends the trace unless a
        sibling is still running (its end then ends it)."""
        self.error_type = type(error).__name__
        if all(s.ended_ns is not None for s in self.siblings):
            self._done()

    @property
    def is_error(self) -> bool:
        return self.error_type is not None or any(s.error_type is not None for s in self.siblings)

    @property
    def duration_s(self) -> float:
        return ((self.end_ns or self.now_ns()) - self.start_ns) / 1e9

    def _done(self) -> None:
        if self.end_ns is not None:
            return
        self.end_ns = self.now_ns()
        self._on_done(self)


class RequestTracing(Protocol):
    """What the HTTP front needs of a tracer (``tracing.exporter.Tracer``)."""

    def begin(
        self, traceparent: str | None, subject: Subject, authorization: Interval | None
    ) -> RequestTrace:
        """A new request's trace; it is decided on and exported when it ends."""
        ...

    def parent_refused(self) -> Mapping[str, int]:
        """Requests whose sampled ``traceparent`` was not honoured (the tenant past its share of
        the export queue), by tenant class."""
        ...

    def errors_dropped(self) -> Mapping[str, int]:
        """Failed requests not traced because their tenant had used its share of the export
        queue for errors (and no other rule kept them), by tenant class."""
        ...

    def slow_dropped(self) -> Mapping[str, int]:
        """Slow requests not traced because their tenant had used its share of the export queue
        for slow requests (and no other rule kept them), by tenant class."""
        ...

    def spans_exported(self) -> int:
        """Spans the receiver accepted."""
        ...

    def spans_dropped(self) -> Mapping[str, int]:
        """Spans of kept traces that did not reach the receiver, by reason."""
        ...

    def traces_build_failed(self) -> int:
        """Kept traces whose spans could not be built (none was made or exported)."""
        ...

    def shutdown(self) -> None:
        """Exports what is queued and stops."""
        ...
