"""A finished ``RequestTrace`` as OpenTelemetry spans (needs the ``otel`` extra).

The tree (one trace per request)::

    <operation> <model>                 SERVER; GenAI attributes, tenant, revision, verdict
    ├── loraplex.authorization          the key check and the tenant's rate bucket
    ├── loraplex.resolution             alias -> revision
    └── loraplex.engine                 one per choice; replica id in a fleet
        ├── loraplex.queue              arrival in the engine -> first scheduled
        ├── loraplex.residency          tier found, placement, deferral (until the lease)
        │   └── loraplex.load.<stage>   resolve, fetch, verify, commit, read (decode), copy
        ├── loraplex.mode_transition    a merge/unmerge it waited for (docs/modes.md)
        └── loraplex.batch              one per run of same-shaped steps (size, revisions,
                                        kernel strategy)

Attribute names: the OpenTelemetry GenAI conventions (``gen_ai.*``, ``error.type``) where one
exists; ``loraplex.*`` for what they lack (tenant, tenant class, revision, tier, residency).
The spans are built after the fact from recorded times (``ReadableSpan``), which is what lets
the sampling decision wait for the request's end.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from loraplex.engine.trace_log import EngineTrace
from loraplex.tracing.context import new_span_id
from loraplex.tracing.record import RequestTrace, Sibling

Attributes = dict[str, AttributeValue]
SCOPE = InstrumentationScope("loraplex")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class SpanBuilder:
    """Turns finished traces into spans for one resource (``service.name``)."""

    def __init__(
        self,
        resource: Resource,
        mask: Callable[[str], str],
        base_model: str,
        rng: random.Random,
    ) -> None:
        self._resource = resource
        self._mask = mask
        self._base_model = base_model
        self._rng = rng

    def build(self, trace: RequestTrace, kept_by: str) -> list[ReadableSpan]:
        """Every span of ``trace`` (see the module docstring); ``kept_by``: why it is kept."""
        ids = trace.ids
        root_ctx = SpanContext(ids.trace_id, ids.span_id, False, _SAMPLED)
        parent = (
            None
            if ids.parent_id is None
            else SpanContext(ids.trace_id, ids.parent_id, True, _SAMPLED)
        )
        end_ns = trace.end_ns or trace.now_ns()
        spans = [
            self._span(
                self._root_name(trace),
                root_ctx,
                parent,
                trace.start_ns,
                end_ns,
                {**self._root_attributes(trace), "loraplex.trace.kept_by": kept_by},
                kind=SpanKind.SERVER,
                error=trace.error_type or _first_error(trace),
            )
        ]
        auth, resolution = trace.authorization, trace.resolution
        if auth is not None:
            spans.append(
                self._child("loraplex.authorization", root_ctx, auth.start_ns, auth.end_ns, {})
            )
        if resolution is not None:
            attrs = self._resolution_attributes(trace)
            start, end = resolution.start_ns, resolution.end_ns
            spans.append(self._child("loraplex.resolution", root_ctx, start, end, attrs))
        for sibling in trace.siblings:
            spans.extend(self._engine_spans(root_ctx, sibling, end_ns))
        return spans

    # --- attributes --------------------------------------------------------------------------

    def _model(self, trace: RequestTrace) -> str:
        model = trace.subject.model
        return model if model == self._base_model else self._mask(model)

    def _root_name(self, trace: RequestTrace) -> str:
        return f"{trace.subject.operation} {self._model(trace)}"

    def _root_attributes(self, trace: RequestTrace) -> Attributes:
        subject = trace.subject
        siblings = trace.siblings
        attrs: Attributes = {
            "gen_ai.operation.name": subject.operation,
            "gen_ai.provider.name": "loraplex",
            "gen_ai.request.model": self._model(trace),
            "loraplex.tenant": self._mask(subject.tenant),
            "loraplex.tenant.class": subject.tenant_class,
        }
        if trace.revision is not None or trace.resolution is not None:
            attrs["gen_ai.response.model"] = self._revision(trace)
        if siblings:
            attrs["gen_ai.request.choice.count"] = len(siblings)
            attrs["gen_ai.usage.input_tokens"] = sum(s.input_tokens for s in siblings)
            attrs["gen_ai.usage.output_tokens"] = sum(s.output_tokens for s in siblings)
            attrs["gen_ai.response.finish_reasons"] = [s.outcome or "error" for s in siblings]
        verdicts = [s.verdict for s in siblings if s.verdict is not None]
        if verdicts:
            attrs["loraplex.release.verdict"] = verdicts[0] if len(set(verdicts)) == 1 else "mixed"
        return attrs

    def _revision(self, trace: RequestTrace) -> str:
        return self._base_model if trace.revision is None else self._mask(trace.revision)

    def _resolution_attributes(self, trace: RequestTrace) -> Attributes:
        attrs: Attributes = {"loraplex.adapter.revision": self._revision(trace)}
        if trace.arrival_tier is not None:
            attrs["loraplex.adapter.arrival_tier"] = trace.arrival_tier
        return attrs

    # --- the engine's part -------------------------------------------------------------------

    def _engine_spans(self, root: SpanContext, sibling: Sibling, end_ns: int) -> list[ReadableSpan]:
        start = sibling.submitted_ns
        stop = sibling.ended_ns or end_ns
        engine = sibling.engine
        attrs: Attributes = {
            "loraplex.engine.request_id": sibling.request_id,
            "gen_ai.usage.input_tokens": sibling.input_tokens,
            "gen_ai.usage.output_tokens": sibling.output_tokens,
        }
        if sibling.outcome is not None:
            attrs["gen_ai.response.finish_reasons"] = [sibling.outcome]
        if sibling.verdict is not None:
            attrs["loraplex.release.verdict"] = sibling.verdict
        if engine is not None:
            attrs.update(_engine_attributes(engine))
        events = []
        if sibling.first_token_ns is not None:
            events.append(Event("loraplex.first_token", {}, sibling.first_token_ns))
        ctx = self._context(root)
        span = self._span(
            "loraplex.engine", ctx, root, start, stop, attrs, error=sibling.error_type,
            events=events,
        )  # fmt: skip
        if engine is None:
            return [span]
        return [span, *self._stage_spans(ctx, start, stop, engine)]

    def _stage_spans(
        self, parent: SpanContext, start: int, stop: int, engine: EngineTrace
    ) -> list[ReadableSpan]:
        def at(offset_s: float) -> int:
            return min(stop, start + int(offset_s * 1e9))

        spans = []
        if engine.queue_s is not None:
            spans.append(self._child("loraplex.queue", parent, start, at(engine.queue_s), {}))
        if engine.placement not in ("base", "none") or engine.deferred_s is not None:
            spans.extend(self._residency_spans(parent, start, at, engine))
        for mark in engine.mode_transitions:
            start_ns = at(mark.start_offset_s)
            mode_attrs: Attributes = {
                "loraplex.mode.direction": mark.direction,
                "loraplex.mode.revision": self._mask(mark.revision),
                "loraplex.mode.transition_s": mark.seconds,
            }
            end_ns = at(mark.start_offset_s + mark.seconds)
            spans.append(
                self._child("loraplex.mode_transition", parent, start_ns, end_ns, mode_attrs)
            )
        for run in engine.batches:
            attrs: Attributes = {
                "loraplex.batch.size": run.batch_size,
                "loraplex.batch.revisions": run.num_revisions,
                "loraplex.batch.kernel_strategy": run.strategy,
                "loraplex.batch.steps": run.num_steps,
            }
            spans.append(
                self._child(
                    "loraplex.batch", parent, at(run.start_offset_s), at(run.end_offset_s), attrs
                )
            )
        return spans

    def _residency_spans(
        self, parent: SpanContext, start: int, at: Callable[[float], int], engine: EngineTrace
    ) -> list[ReadableSpan]:
        leased = at(engine.leased_offset_s or engine.end_offset_s)
        attrs: Attributes = {"loraplex.residency.placement": engine.placement}
        if engine.adapter_tier is not None:
            attrs["loraplex.adapter.tier"] = engine.adapter_tier.name
        attrs["loraplex.residency.deferred"] = engine.deferred_s is not None
        if engine.deferred_s is not None:
            attrs["loraplex.residency.deferred_s"] = engine.deferred_s
        attrs["loraplex.residency.room_wait_s"] = engine.room_wait_s
        ctx = self._context(parent)
        spans = [self._span("loraplex.residency", ctx, parent, start, leased, attrs)]
        # The stages ran back to back and ended when the lease came.
        cursor = leased - int(sum(s for _, s in engine.load_stages) * 1e9)
        for stage, seconds in engine.load_stages:
            end = cursor + int(seconds * 1e9)
            stage_attrs: Attributes = {
                "loraplex.load.stage": stage,
                "loraplex.load.seconds": seconds,
            }
            name = f"loraplex.load.{stage}"
            spans.append(self._child(name, ctx, max(cursor, start), end, stage_attrs))
            cursor = end
        return spans

    # --- span making ---------------------------------------------------------------------------

    def _context(self, parent: SpanContext) -> SpanContext:
        return SpanContext(parent.trace_id, new_span_id(self._rng), False, _SAMPLED)

    def _child(
        self, name: str, parent: SpanContext, start_ns: int, end_ns: int, attrs: Attributes
    ) -> ReadableSpan:
        return self._span(name, self._context(parent), parent, start_ns, end_ns, attrs)

    def _span(  # noqa: PLR0917 (a span's fields, in OpenTelemetry's order)
        self,
        name: str,
        ctx: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        attrs: Attributes,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        error: str | None = None,
        events: list[Event] | None = None,
    ) -> ReadableSpan:
        if error is not None:
            attrs = {**attrs, "error.type": error}
        status = Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.UNSET)
        return ReadableSpan(
            name,
            context=ctx,
            parent=parent,
            resource=self._resource,
            attributes=attrs,
            events=events or (),
            kind=kind,
            status=status,
            start_time=start_ns,
            end_time=max(start_ns, end_ns),
            instrumentation_scope=SCOPE,
        )


def _engine_attributes(engine: EngineTrace) -> Attributes:
    attrs: Attributes = {"loraplex.residency.placement": engine.placement}
    if engine.adapter_tier is not None:
        attrs["loraplex.adapter.tier"] = engine.adapter_tier.name
    if engine.queue_s is not None:
        attrs["loraplex.queue_s"] = engine.queue_s
    if engine.prefix_reused_tokens is not None:
        attrs["loraplex.kv.prefix_reused_tokens"] = engine.prefix_reused_tokens
    if engine.replica_id is not None:
        attrs["loraplex.replica.id"] = engine.replica_id
    if engine.num_steps_dropped:
        attrs["loraplex.batch.steps_dropped"] = engine.num_steps_dropped
    return attrs


def _first_error(trace: RequestTrace) -> str | None:
    return next((s.error_type for s in trace.siblings if s.error_type is not None), None)
