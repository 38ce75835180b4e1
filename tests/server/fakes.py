"""Test fakes for the server: an EngineClient that answers with a script, a character tokenizer,
and a cache pipeline that moves nothing (so residency admin and cache metrics run for real)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import cast

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import (
    EngineHealth,
    EngineLoad,
    EngineRequest,
    TokenDelta,
    TokenLogprob,
)
from loraplex.model.tokenizer import TextTokenizer
from loraplex.residency.cache.tiered_cache import CacheConfig, TieredAdapterCache
from loraplex.residency.ledger import Tier, TierBudget
from loraplex.residency.pipeline import (
    CancelToken,
    Footprint,
    Move,
    Prepared,
    RecoveredCopy,
    Resolved,
)
from loraplex.residency.stats import Stage

BOS = 1
EOS = 2
QUEUE_S = 0.03  # the queue wait the fake reports on every first delta
_OFFSET = 3


class CharTokenizer:
    """One token per character (offset past the special ids); encode adds BOS like the demo's."""

    eos_token_ids = frozenset({EOS})

    def encode(self, text: str) -> list[int]:
        return [BOS, *(ord(c) + _OFFSET for c in text)]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t - _OFFSET) for t in token_ids if t >= _OFFSET)

    def token_text(self, token_id: int) -> str:
        """Special ids as themselves, like ``TextTokenizer.token_text``."""
        return self.decode([token_id]) if token_id >= _OFFSET else f"<special:{token_id}>"


def on_event_loop() -> bool:
    """Whether an event loop runs on the calling thread: what a work-off-the-loop test records
    from inside the work it moved."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def reply_for(request: EngineRequest) -> str:
    """What the fake engine answers: names the revision, so tests can see who answered."""
    who = "base" if request.adapter_key is None else request.adapter_key.ref
    return f" {who} answers."


def fake_logprob(request: EngineRequest, count: int) -> float:
    """The fake's logprob of output token ``count`` (1-based): lower for larger seeds modulo 4,
    so best_of's siblings (seed + i) rank in a known order."""
    seed = request.params.seed or 0
    return -0.25 * (1 + seed % 4) - 0.01 * count


def fake_logprobs(request: EngineRequest, count: int) -> tuple[TokenLogprob, ...] | None:
    """One entry for output token ``count`` when the request asked for logprobs; its top list
    holds ``params.logprobs`` alternatives (the chosen token first)."""
    num_top = request.params.logprobs
    if num_top is None:
        return None
    token, logprob = count + _OFFSET, fake_logprob(request, count)
    top = tuple((token + k, logprob - k) for k in range(num_top))
    return (TokenLogprob(token, logprob, 1, top),)


def fake_prompt_logprobs(request: EngineRequest) -> tuple[TokenLogprob | None, ...] | None:
    """Each prompt token after the first at logprob -1 - 0.5 x position, as asked."""
    num_top = request.params.prompt_logprobs
    if num_top is None:
        return None
    entries = [
        TokenLogprob(
            t, -1.0 - 0.5 * i, 1, tuple((t + k, -1.0 - 0.5 * i - k) for k in range(num_top))
        )
        for i, t in enumerate(request.prompt_token_ids[1:], start=1)
    ]
    return (None, *entries)


def _stop_reason(request: EngineRequest, reason: str | None) -> int | None:
    """A finished "stop" names the request's first stop token id, if it has any (as if the
    fake's last word had been that token)."""
    ids = request.params.stop_token_ids
    return ids[0] if reason == "stop" and ids else None


@dataclass
class FakeEngine:
    """Streams ``reply_for(request)`` one word per delta (cut at max_tokens; stop strings are
    ignored); errors and pauses on demand."""

    errors: dict[str, Exception] = field(default_factory=dict)  # who -> raised before any delta
    mid_stream_errors: dict[str, Exception] = field(default_factory=dict)  # raised after one delta
    gate: asyncio.Event | None = None  # when set, each stream waits on it after its first delta
    requests: list[EngineRequest] = field(default_factory=list)  # every request received
    aborted: list[str] = field(default_factory=list)  # ids aborted (abort() or closed stream)
    paused: list[str] = field(default_factory=list)  # ids paused (pause()), in call order
    resumed: list[str] = field(default_factory=list)  # ids resumed (resume()), in call order
    running: tuple[AdapterKey, ...] = ()  # reported as resident in load_snapshot()
    waiting: tuple[AdapterKey, ...] = ()  # reported as waiting in load_snapshot()
    lora_running: tuple[AdapterKey, ...] = ()  # adapters of running requests in load_snapshot()
    lora_waiting: tuple[AdapterKey, ...] = ()  # adapters of queued requests in load_snapshot()
    char_tokenizer: CharTokenizer = field(default_factory=CharTokenizer)
    leased_from: Tier | None = None  # the adapter tier reported on an adapter request's first delta
    # Per request: an error raised after its first delta (a sibling failing mid-stream); None: none
    fail: Callable[[EngineRequest], Exception | None] | None = None

    @property
    def tokenizer(self) -> TextTokenizer:
        return cast(TextTokenizer, self.char_tokenizer)

    def load_snapshot(self) -> EngineLoad:
        return EngineLoad(
            num_waiting=1, num_adapter_wait=len(self.waiting), num_running=2, kv_usage=0.25,
            running_adapters=self.running, waiting_adapters=self.waiting, max_loras=4,
            num_active_tokens=12, num_paused=3, num_pauses=5, num_resumes=2,
            num_pauses_kv_kept=4, num_paused_kv_freed=1, num_resume_recomputed_tokens=37,
            lora_running=self.lora_running, lora_waiting=self.lora_waiting,
        )  # fmt: skip

    def health(self) -> EngineHealth:
        return EngineHealth(up=True, num_restarts=0, down_reason=None)

    async def pause(self, request_id: str) -> None:
        self.paused.append(request_id)

    async def resume(self, request_id: str) -> None:
        self.resumed.append(request_id)

    async def abort(self, request_id: str) -> None:
        if request_id not in self.aborted:
            self.aborted.append(request_id)

    def generate(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        return self._stream(request)

    async def _stream(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        self.requests.append(request)
        who = "base" if request.adapter_key is None else request.adapter_key.ref
        if who in self.errors:
            raise self.errors[who]
        # NOTE: stop strings are not applied here: they are the engine's (tested against it).
        words = reply_for(request).split(" ")[1:]
        finished = False
        try:
            for count, word in enumerate(words, start=1):
                piece = " " + word
                last = count == len(words) or count == request.params.max_tokens
                reason = ("stop" if count == len(words) else "length") if last else None
                finished = last
                first = count == 1
                tier = self.leased_from if first and request.adapter_key is not None else None
                yield TokenDelta((count + _OFFSET,), piece, reason, len(request.prompt_token_ids),
                                 count, QUEUE_S if first else None, tier,
                                 logprobs=fake_logprobs(request, count),
                                 prompt_logprobs=fake_prompt_logprobs(request) if first else None,
                                 stop_reason=_stop_reason(request, reason))  # fmt: skip
                if last:
                    return
                if count == 1 and who in self.mid_stream_errors:
                    raise self.mid_stream_errors[who]
                failure = self.fail(request) if count == 1 and self.fail is not None else None
                if failure is not None:
                    raise failure
                if count == 1 and self.gate is not None:
                    await self.gate.wait()
        finally:
            if not finished:
                await self.abort(request.request_id)


class NullPipeline:
    """A LoadPipeline that moves nothing (every adapter weighs one 100-byte unit)."""

    prepares_l0 = True  # its prepare reports a READ stage for every move

    def resolve(self, key: AdapterKey, cancel: CancelToken) -> Resolved:
        return Resolved(Footprint(100, 100, 100), {Stage.RESOLVE: 0.001})

    def prepare(self, move: Move, cancel: CancelToken) -> Prepared:
        return Prepared(None, {Stage.READ: 0.002})

    def install(
        self, move: Move, prepared: Prepared, slot: int | None, cancel: CancelToken
    ) -> dict[Stage, float]:
        return {Stage.COPY: 0.001}

    def discard(self, move: Move, prepared: Prepared) -> None:
        return None

    def drop(self, tier: Tier, key: AdapterKey, slot: int | None) -> None:
        return None

    def recover(self) -> list[RecoveredCopy]:
        return []


def null_cache(slots: int = 2) -> TieredAdapterCache:
    budgets = {
        Tier.L0: TierBudget(slots * 100, slots),
        Tier.L1: TierBudget(10 * 100),
        Tier.L2: TierBudget(20 * 100),
    }
    return TieredAdapterCache(CacheConfig(budgets), NullPipeline())
