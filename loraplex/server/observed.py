"""Each engine stream of a request observed: its timing and outcome recorded for the metrics
(``observe``, ``Observed``) and stamped on the request's trace (``start_trace``).

``Observed`` passes every delta through unchanged; closing it closes the engine stream, so an
abort reaches the engine however the response ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import anyio
from starlette.requests import Request

from loraplex.engine.protocol import TokenDelta
from loraplex.registry import Tenant
from loraplex.release.traffic import classify
from loraplex.residency.ledger import Tier
from loraplex.server.auth import AUTHORIZATION_NS
from loraplex.server.deps import ServerDeps
from loraplex.server.metrics import RequestObservation, ServerMetrics
from loraplex.server.serving import Target
from loraplex.tracing.record import Interval, RequestTrace, Subject


def observe(
    metrics: ServerMetrics,
    tenant: Tenant,
    target: Target,
    response_id: str,
    sticky_key: str | None = None,
    *,
    prompt_tokens: int = 0,
    max_tokens: int = 0,
) -> RequestObservation:
    """Starts timing a request; ``cold`` means its adapter was not in a GPU slot on arrival.
    ``sticky_key`` tells the alias owner's end users apart when a release is judged."""
    cold = target.adapter_key is not None and target.info.tier != Tier.L0.name
    return metrics.start_request(
        tenant.priority.value,
        cold,
        time.monotonic(),
        revision=target.info.revision,
        tenant=tenant.name,
        response_id=response_id,
        sticky_key=sticky_key,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        shape=(target.rank, target.size_bytes),
    )


TRACEPARENT_HEADER = "traceparent"


def start_trace(
    request: Request, deps: ServerDeps, tenant: Tenant, model: str, operation: str
) -> RequestTrace | None:
    """The request's trace (under the caller's W3C ``traceparent`` when valid); None when
    tracing is off. A ``traceparent`` given more than once is invalid (W3C Trace Context:
    combined, the values are no one header's value), so the request starts a new trace, as
    for any malformed one; the first was used before. Not refused as ``SINGLE_HEADERS`` are:
    an invalid ``traceparent`` is never an error."""
    tracing = deps.tracing
    if tracing is None:
        return None
    stamps = request.scope.get("state", {}).get(AUTHORIZATION_NS)
    authorization = None if stamps is None else Interval(*stamps)
    subject = Subject(operation, model, tenant.name, tenant.priority.value)
    given = request.headers.getlist(TRACEPARENT_HEADER)
    traceparent = given[0] if len(given) == 1 else None
    return tracing.begin(traceparent, subject, authorization)


class Observed:
    """``stream`` unchanged, with TTFT / TPOT / outcome recorded; closing it closes ``stream``.
    With a ``trace``, the stream is one of its siblings (its deltas and its end are stamped).

    NOTE: a class, not an async generator: a generator closed before its first read (a sibling
    whose pump task was cancelled before it ran, when the request was aborted) never runs its
    ``finally``, and the request counted as arrived was never counted as ended."""

    def __init__(
        self,
        stream: AsyncIterator[TokenDelta],
        observation: RequestObservation,
        trace: RequestTrace | None = None,
        request_id: str = "",
    ) -> None:
        self._stream = stream
        self._observation = observation
        self._outcome = "error"  # the finish reason once the last delta came
        self._trace = trace
        self._sibling = None if trace is None else trace.submit(request_id)
        self._error: BaseException | None = None  # what the stream raised, if it did

    def __aiter__(self) -> Observed:
        return self

    async def __anext__(self) -> TokenDelta:
        try:
            delta = await anext(self._stream)
        except StopAsyncIteration:
            await self._end(self._outcome)  # no last delta: "error", as a failure
            raise
        except asyncio.CancelledError:
            await self.aclose()
            raise
        except Exception as exc:
            self._observation.fail(exc)  # decides whether the failure counts against its revision
            self._error = exc
            await self.aclose()
            raise
        self._observation.on_delta(delta, time.monotonic())
        if self._sibling is not None:
            self._sibling.on_delta(delta, time.time_ns())
        if delta.finish_reason is not None:
            self._outcome = delta.finish_reason
        return delta

    async def aclose(self) -> None:
        """Records the outcome (once): closed before its last delta, the client went away
        (``abort``), unless a failure was recorded (``error``)."""
        failed = self._observation.failed
        await self._end("abort" if self._outcome == "error" and not failed else self._outcome)

    async def _end(self, outcome: str) -> None:
        self._observation.finish(outcome)  # only the first call counts
        if self._trace is not None and self._sibling is not None:
            revision = self._observation.revision
            verdict = None if revision is None else classify(outcome, self._error).value
            self._trace.sibling_ended(self._sibling, outcome, self._error, verdict)
        with anyio.CancelScope(shield=True):
            await _aclose(self._stream)


async def _aclose(stream: AsyncIterator[TokenDelta]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
