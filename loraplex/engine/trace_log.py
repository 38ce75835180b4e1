"""What the engine records about one traced request, for the front to export as spans
(torch-free; no OpenTelemetry here: the engine only stamps times into the request's state).

Why the engine returns its stages instead of exporting them: the engine may run in a child
process or in a fleet replica; recording a few clock reads into ``Request.trace_log`` keeps
its hot path free of exporters, sockets and context objects, and the front (which decides
whether a request is sampled only once it ended: slow requests and errors are kept within
their tenant's shares of the export queue)
turns the finished ``EngineTrace`` into spans.

Times are seconds relative to the request's arrival in the engine (``offset`` fields), so the
front can place them on its own clock whatever the engine's clock is. Batches are kept as runs:
consecutive steps with the same (batch size, distinct revisions, kernel strategy) make one
``BatchRun``, and at most ``MAX_BATCH_RUNS`` runs are kept (the rest counted), so a long decode
allocates only when its batch changes shape, never per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.residency.ledger import Tier

MAX_BATCH_RUNS = 32  # batch runs kept per request; later ones are only counted
MAX_MODE_TRANSITIONS = 8  # mode transitions kept per request (auto dwells a minute between two)


@dataclass(frozen=True)
class BatchRun:
    """Consecutive engine steps a request took part in with the same batch shape."""

    start_offset_s: float  # first step of the run, seconds after engine arrival
    end_offset_s: float  # last step of the run, seconds after engine arrival
    num_steps: int  # steps in the run
    batch_size: int  # requests (chunks) in each step's forward
    num_revisions: int  # distinct adapter revisions in the batch (the base model counts one)
    strategy: str  # the LoRA kernel strategy the step ran (ops.base.Strategy value)


@dataclass(frozen=True)
class ModeTransitionMark:
    """A merge or unmerge (docs/modes.md) that ran between two steps while the request was live:
    every live request waited for it."""

    start_offset_s: float  # when it began, seconds after engine arrival
    seconds: float  # how long it took
    direction: str  # "merge" or "unmerge"
    revision: str  # the adapter ref merged or unmerged


@dataclass(frozen=True)
class EngineTrace:
    """The engine's stages of one request, returned on its last delta."""

    queue_s: float | None  # arrival to first scheduled; None: never ran
    adapter_tier: Tier | None  # the tier its lease found the adapter in; None: no lease
    deferred_s: float | None  # seconds it waited in ADAPTER_WAIT for a load; None: no deferral
    placement: str  # "base", "resident", "loaded", "failed:<ErrorType>", "none"
    load_stages: tuple[tuple[str, float], ...]  # (stage, seconds) of its adapter's load
    room_wait_s: float  # seconds its load waited for room in a tier
    leased_offset_s: float | None  # when its lease came, seconds after arrival; None: no lease
    prefix_reused_tokens: int | None  # prompt tokens found in the KV prefix cache; None: unrun
    batches: tuple[BatchRun, ...]  # the batches it took part in (see the module docstring)
    num_steps_dropped: int  # steps after MAX_BATCH_RUNS runs were kept, counted only
    end_offset_s: float  # its end, seconds after engine arrival
    replica_id: str | None = None  # the fleet replica that ran it (set by the replica)
    mode_transitions: tuple[ModeTransitionMark, ...] = ()  # at most MAX_MODE_TRANSITIONS
    # When its deferred lease's load completed (seconds after arrival; the lease is collected
    # at the next step's start, ``leased_offset_s``); None: leased at once, or no lease.
    ready_offset_s: float | None = None


class TraceLog:
    """The mutable per-request record (owned by the engine thread)."""

    __slots__ = (
        "_arrival_s",
        "_deferred_at_s",
        "_dropped",
        "_runs",
        "_transitions",
        "deferred_s",
        "leased_offset_s",
        "load_stages",
        "placement",
        "prefix_reused_tokens",
        "ready_s",
        "room_wait_s",
        "tier",
    )

    def __init__(self, arrival_s: float) -> None:
        self._arrival_s = arrival_s
        self._deferred_at_s: float | None = None
        self._runs: list[list[float | int | str]] = []  # BatchRun fields, mutable
        self._dropped = 0
        self._transitions: list[ModeTransitionMark] = []
        self.deferred_s: float | None = None
        self.tier: Tier | None = None
        self.placement = "none"
        self.load_stages: tuple[tuple[str, float], ...] = ()
        self.room_wait_s = 0.0
        self.leased_offset_s: float | None = None
        self.prefix_reused_tokens: int | None = None
        self.ready_s: float | None = None  # when its deferred lease's load completed

    def defer(self, now_s: float) -> None:
        """The request waits for its adapter to load."""
        self._deferred_at_s = now_s

    def ready(self, now_s: float) -> None:
        """Its deferred lease's load completed (on the loader's thread; one float written,
        read by the engine thread only after it saw the future done, or at the request's end)."""
        self.ready_s = now_s

    def leased(self, now_s: float, tier: Tier, stages: dict[str, float], room_s: float) -> None:
        """Its lease came, from ``tier`` after the load ``stages`` (empty: a GPU-slot hit)."""
        if self._deferred_at_s is not None:
            self.deferred_s = now_s - self._deferred_at_s
        self.tier = tier
        self.placement = "resident" if tier is Tier.L0 else "loaded"
        self.load_stages = tuple(stages.items())
        self.room_wait_s = room_s
        self.leased_offset_s = now_s - self._arrival_s

    def lease_failed(self, now_s: float, error: BaseException) -> None:
        if self._deferred_at_s is not None:
            self.deferred_s = now_s - self._deferred_at_s
        self.placement = f"failed:{type(error).__name__}"

    def batch(self, now_s: float, size: int, num_revisions: int, strategy: str) -> None:
        """One step it took part in; extends the last run when the shape is unchanged."""
        if self._dropped:  # full: later steps are only counted (never glued onto the last run)
            self._dropped += 1
            return
        offset = now_s - self._arrival_s
        runs = self._runs
        if runs:
            last = runs[-1]
            if last[3] == size and last[4] == num_revisions and last[5] == strategy:
                last[1] = offset
                last[2] = int(last[2]) + 1
                return
        if len(runs) >= MAX_BATCH_RUNS:
            self._dropped += 1
            return
        runs.append([offset, offset, 1, size, num_revisions, strategy])

    def mode_transition(self, end_s: float, seconds: float, direction: str, revision: str) -> None:
        """A merge or unmerge of ``seconds`` ended at ``end_s`` while this request was live."""
        if len(self._transitions) < MAX_MODE_TRANSITIONS:
            start = end_s - seconds - self._arrival_s
            self._transitions.append(ModeTransitionMark(start, seconds, direction, revision))

    def finish(self, now_s: float, queue_s: float | None, base: bool) -> EngineTrace:
        placement = "base" if base and self.placement == "none" else self.placement
        ready = self.ready_s
        if ready is not None and self.leased_offset_s is not None:
            # the engine may collect the lease before the callback stamped it: never later
            ready = min(ready, self._arrival_s + self.leased_offset_s)
        return EngineTrace(
            queue_s=queue_s,
            adapter_tier=self.tier,
            deferred_s=self.deferred_s,
            placement=placement,
            load_stages=self.load_stages,
            room_wait_s=self.room_wait_s,
            leased_offset_s=self.leased_offset_s,
            prefix_reused_tokens=self.prefix_reused_tokens,
            batches=tuple(
                BatchRun(float(a), float(b), int(n), int(s), int(r), str(k))
                for a, b, n, s, r, k in self._runs
            ),
            num_steps_dropped=self._dropped,
            end_offset_s=now_s - self._arrival_s,
            mode_transitions=tuple(self._transitions),
            ready_offset_s=None if ready is None else ready - self._arrival_s,
        )
