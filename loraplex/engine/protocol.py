"""The seam between the engine and the HTTP server.

The server resolves tenants and aliases (control plane) and hands the engine an
``EngineRequest`` carrying the immutable ``AdapterKey``; the engine streams ``TokenDelta``s
back. Errors surface from the stream as domain exceptions (``loraplex.errors``):
transient ``CapacityError`` subclasses (``QueueTimeoutError``, ``QueueFullError``,
``EngineUnavailableError``: retry later), permanent ``UnservableError`` subclasses (a prompt too
long, an adapter too large for any tier: never retry), ``AdapterError`` subclasses and
``LoadCancelledError`` (the revision failed to load). ``server/errors.py`` maps them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.mode_report import ModeReport
from loraplex.engine.trace_log import EngineTrace
from loraplex.residency.ledger import Tier

# Defined with SamplingParams (the sampler, below the engine, builds them); re-exported here as
# part of the seam the server reads. The finish reasons a TokenDelta carries live there too, so
# the release traffic accounting reads them without importing the engine.
from loraplex.sampling import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, TokenLogprob

if TYPE_CHECKING:
    from loraplex.model.tokenizer import TextTokenizer
    from loraplex.sampling import SamplingParams

__all__ = [
    "DELTA_MERGE_RULES",
    "FINISH_ABORT",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "EngineClient",
    "EngineHealth",
    "EngineLoad",
    "EngineRequest",
    "TokenDelta",
    "TokenLogprob",
    "merge_deltas",
]


@dataclass(frozen=True)
class EngineRequest:
    """One generation request, already authorised and resolved to a revision."""

    request_id: str  # unique among live requests; also the alias draw key
    tenant: str  # owning tenant (fairness, quotas)
    adapter_key: AdapterKey | None  # resolved revision; None = base model
    prompt_token_ids: tuple[int, ...]  # the tokenized prompt (chat template already applied)
    params: SamplingParams  # sampling and stopping (loraplex.model.sampler)
    deadline_s: float | None = None  # max seconds queued before QueueTimeoutError; None: default
    # A sibling's request id (same tenant, adapter and prompt; ``n`` > 1): this request is not
    # scheduled until the sibling's prompt is in the KV cache (or the sibling is gone), so it
    # reuses the sibling's prompt blocks instead of computing them again. None: no sibling.
    prefix_leader: str | None = None
    # The caller's session (``user`` field or X-Session-Id, as ``serving.sticky_key`` makes it):
    # a fleet keeps one session on one replica, where its KV prefix is. None: no session.
    session_key: str | None = None
    # The W3C ``traceparent`` of the front's request span when the request is traced (the
    # engine then records its stages into ``TokenDelta.trace``); None: not traced.
    traceparent: str | None = None
    # Record the engine's stages (``TokenDelta.trace``) without a trace: the front's request
    # log writes them (``server/request_log.py``). False: only a traced request records them.
    stages: bool = False
    # A release's output probe (``serve/release_env.py``), not a tenant's traffic: ``auto``'s
    # token window (``ModeController.after_step``) does not count its tokens. NOTE: it did, so a
    # release's probes alone made ``auto`` merge the candidate they were still checking, before
    # any tenant called it (docs/benchmarks/attack27.md).
    probe: bool = False

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id '' is invalid; expected a non-empty string")
        if not self.tenant:
            raise ValueError("tenant '' is invalid; expected a non-empty string")
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids () is invalid; expected at least one token")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline_s {self.deadline_s} is invalid; expected > 0 or None")


@dataclass(frozen=True)
class TokenDelta:
    """One streamed increment of a request's output."""

    token_ids: tuple[int, ...]  # new tokens since the previous delta
    text: str  # new text (incremental detokenization, stop strings applied)
    finish_reason: str | None  # None while running; "stop" | "length" | "abort"
    prompt_tokens: int  # prompt length in tokens
    completion_tokens: int  # tokens generated so far (including these)
    queue_s: float | None = None  # on a request's first delta: seconds queued before it ran
    # On an adapter request's first delta: the tier the engine found the adapter in when it
    # leased it (Tier.L0: already in a GPU slot), i.e. what its latency actually paid for.
    adapter_tier: Tier | None = None
    # One per token of ``token_ids`` when the request asked for ``logprobs``; else None.
    logprobs: tuple[TokenLogprob, ...] | None = None
    # On the first delta of a request that asked for ``prompt_logprobs``: one per prompt token,
    # the first None (nothing precedes it), as vLLM.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    # With finish_reason "stop": the stop string or stop token id that ended it; None for EOS.
    stop_reason: str | int | None = None
    # On the last delta of a traced request (``EngineRequest.traceparent``): its engine stages.
    trace: EngineTrace | None = None


# --- merging queued deltas ----------------------------------------------------------------------
# A consumer that falls behind reads several queued deltas of one request as one. Every field of
# TokenDelta has exactly one rule here, checked at import: a field added without a rule fails the
# import, never silently drops out of merged output (issue 25: logprobs, prompt_logprobs and
# stop_reason were lost under load that way).
MergeRule = Callable[[Any, Any], Any]


def _concat(first: Any, second: Any) -> Any:
    """Per-token increments (token ids, text): both, in order."""
    return first + second


def _concat_optional(first: Any, second: Any) -> Any:
    """Per-token increments that exist only when asked for (logprobs): both, in order; None
    only when neither has any (a closing abort delta carries no tokens and no logprobs)."""
    if first is None and second is None:
        return None
    return (first or ()) + (second or ())


def _latest(first: Any, second: Any) -> Any:
    """Running state (finish reason, token counts): the later delta's."""
    return second


def _earliest_set(first: Any, second: Any) -> Any:
    """Sent once, on a request's first delta (queue time, tier, prompt logprobs).
    NOTE: ``is not None``, not ``or``: Tier.L0 is 0 and an empty tuple is a value."""
    return first if first is not None else second


def _latest_set(first: Any, second: Any) -> Any:
    """Sent once, on the last delta (stop reason)."""
    return second if second is not None else first


DELTA_MERGE_RULES: Mapping[str, MergeRule] = MappingProxyType(
    {
        "token_ids": _concat,
        "text": _concat,
        "finish_reason": _latest,
        "prompt_tokens": _latest,
        "completion_tokens": _latest,
        "queue_s": _earliest_set,
        "adapter_tier": _earliest_set,
        "logprobs": _concat_optional,
        "prompt_logprobs": _earliest_set,
        "stop_reason": _latest_set,
        "trace": _latest_set,
    }
)


def _check_rules_total(rules: Mapping[str, MergeRule]) -> None:
    names = {f.name for f in fields(TokenDelta)}
    if set(rules) != names:
        missing, extra = sorted(names - set(rules)), sorted(set(rules) - names)
        raise TypeError(f"TokenDelta merge rules: fields without a rule {missing}, unknown {extra}")


_check_rules_total(DELTA_MERGE_RULES)


def merge_deltas(
    first: TokenDelta, second: TokenDelta, rules: Mapping[str, MergeRule] = DELTA_MERGE_RULES
) -> TokenDelta:
    """One delta for two consecutive ones of the same request (``first`` unfinished): what a
    consumer reading both would have seen. ``rules`` is for tests (a mutated rule table)."""
    _check_rules_total(rules)
    return TokenDelta(
        **{name: rule(getattr(first, name), getattr(second, name)) for name, rule in rules.items()}
    )


@dataclass(frozen=True)
class EngineLoad:
    """A point-in-time view of the engine's load (for /metrics and routing)."""

    num_waiting: int  # queued requests whose adapter is resident or that use the base model
    num_adapter_wait: int  # queued requests waiting for their adapter to load
    num_running: int  # requests holding KV blocks (prefilling or decoding)
    kv_usage: float  # fraction 0-1 of KV blocks in use
    running_adapters: tuple[AdapterKey, ...]  # adapters resident in GPU slots (L0)
    waiting_adapters: tuple[AdapterKey, ...]  # adapters with queued requests, not resident
    max_loras: int  # GPU adapter slots
    num_active_tokens: int  # prompt + output tokens of every live request (the router's load)
    mode: ModeReport | None = None  # merged revision and transition times; None: unmerged
    # Revisions (``tenant/name@revision``) merged into the base weights of the replicas this
    # load sums (a fleet ingress's view: ``mode`` is None there). Empty for one engine, whose
    # own merge is in ``mode``; read both through ``merged_revisions``.
    replicas_merged: frozenset[str] = frozenset()
    # live requests paused because their consumers stopped reading (``EngineClient.pause``):
    # neither waiting nor running, holding no seat (their KV blocks kept within
    # ``max_paused_kv_fraction``, engine/sched/kept_kv.py)
    num_paused: int = 0
    num_pauses: int = 0  # requests paused since the engine (re)started (a counter)
    num_resumes: int = 0  # paused requests resumed since the engine (re)started (a counter)
    num_pauses_kv_kept: int = 0  # pauses that kept the request's KV blocks (a counter)
    # KV sequences kept across a pause and freed for other work before their requests ran
    # again (each such request recomputes when it runs; a counter)
    num_paused_kv_freed: int = 0
    # tokens paused requests computed again once resumed, their KV blocks freed by the pause or
    # for other work while paused (a prefix-cache hit not counted; a counter)
    num_resume_recomputed_tokens: int = 0
    # What vLLM's ``vllm:lora_requests_info`` lists (``running_lora_adapters``,
    # ``waiting_lora_adapters``): the adapters with a running request (prefilling or decoding,
    # not paused), and those with a queued one (waiting for a seat or for its adapter); an
    # adapter with both is in both. Not residency: an idle adapter in a slot is in neither.
    lora_running: tuple[AdapterKey, ...] = ()
    lora_waiting: tuple[AdapterKey, ...] = ()

    @property
    def merged_revisions(self) -> frozenset[str]:
        """Every revision merged into base weights behind this load (the admin guard's and a
        release's question: docs/modes.md)."""
        own = None if self.mode is None else self.mode.merged_revision
        return self.replicas_merged if own is None else self.replicas_merged | {own}


@dataclass(frozen=True)
class EngineHealth:
    """Whether the engine takes requests now (for /health, /ready and /metrics)."""

    up: bool  # False while the engine is down (its process died and is being restarted)
    num_restarts: int  # engine restart attempts since the server started (0: never restarted)
    down_reason: str | None  # why it is down, for operators and refused clients; None while up
    starting: bool = False  # down because it has not come up yet (not because it failed since)
    # True while it is alive but made no progress with work pending (``engine/watchdog.py``):
    # not up, new requests refused, live ones waiting for it
    hung: bool = False


class EngineClient(Protocol):
    """What the server needs from an engine (AsyncEngine implements it; tests may fake it)."""

    def generate(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        """Submit ``request`` and stream its output; closing the iterator aborts the request.

        Domain errors (queue timeout, queue full, adapter load failure) are raised from the
        iterator, before or between deltas.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Abort a live request (its stream ends with finish_reason "abort"); unknown ids: no-op."""
        ...

    async def pause(self, request_id: str) -> None:
        """The request's consumer stopped reading: stop generating for it (its seat and KV
        blocks freed) until ``resume``. Advisory: a request that ended meanwhile, an unknown
        id, or an engine that cannot pause (a fleet ingress: docs/operations.md) is a no-op."""
        ...

    async def resume(self, request_id: str) -> None:
        """The request's consumer reads again: generate for it again (undoes ``pause``)."""
        ...

    def load_snapshot(self) -> EngineLoad:
        """Current load; cheap and thread-safe."""
        ...

    def health(self) -> EngineHealth:
        """Whether the engine is up; cheap, thread-safe, and never raises."""
        ...

    @property
    def tokenizer(self) -> TextTokenizer:
        """The base model's tokenizer (prompts are encoded with it, output decoded with it)."""
        ...
