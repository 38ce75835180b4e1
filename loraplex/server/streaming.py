"""Server-sent events for both OpenAI endpoints, and the chunk shapes that differ between them.

A stream opens only after the engine produced its first delta (see ``disconnect.first_item``), so
errors before it get a real HTTP status. An error after it cannot change the status any more:
whatever its type (a domain error or a bug), it is sent as one ``data: {"error": ...}`` event
(what the OpenAI clients raise on), mapped by ``server/errors.py`` like a status would be, and
the stream ends. If the client goes away, the response task is cancelled and the engine request
aborted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import cached_property

from starlette.concurrency import run_in_threadpool

from loraplex.engine.protocol import TokenDelta, TokenLogprob
from loraplex.server.choices import Echo, Fanout, Slotted
from loraplex.server.errors import ApiError, ErrorContext, to_api_error
from loraplex.server.logprobs_format import (
    ChoiceOffsets,
    TokenStrings,
    chat_logprobs,
    completion_logprobs,
)
from loraplex.server.protocol import RevisionInfo, Usage
from loraplex.server.stream_buffer import EchoEvent

DONE = "data: [DONE]\n\n"
# An event carrying more logprob entries than this is formatted on the thread pool (each entry's
# token string and top logprobs, then the JSON dump), as a non-streamed answer is: a choice's
# first event under ``echo`` carries its whole prompt's logprobs (16 choices of 480 echoed
# tokens with ``logprobs: 20`` held the event loop for their events' formatting), in one of the
# tenant's places (``tenant_jobs.py``), so that one tenant's streams cannot take the shared pool.
# An event of a generated token or two stays on the loop, where it costs less than a thread
# hand-off.
MAX_LOOP_LOGPROB_ENTRIES = 64


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def event(payload: object) -> str:
    return f"data: {_json(payload)}\n\n"


def not_read_event(max_bytes: int) -> str:
    """The last event of a stream whose client left more than ``max_bytes`` unread."""
    error = ApiError(
        408,
        f"the stream was aborted: its client left more than {max_bytes} bytes of it unread "
        "(max_stream_buffer_bytes)",
        "invalid_request_error",
        "stream_not_read",
    )
    return event(error.body())


def resumed_too_often_event(max_resumes: int) -> str:
    """The last event of a paused stream whose client fell behind once more after
    ``max_resumes`` resumes (each one may have recomputed the request's output so far)."""
    error = ApiError(
        408,
        f"the stream was aborted: its client fell behind and caught up again more than "
        f"{max_resumes} times, each of which may have recomputed the output so far "
        "(max_stream_resumes)",
        "invalid_request_error",
        "stream_resumed_too_often",
    )
    return event(error.body())


@dataclass(frozen=True)
class ChunkFormat:
    """How one endpoint shapes its stream chunks.

    NOTE: chunks are assembled from strings (the parts every chunk shares are encoded once)
    rather than through the pydantic models, which cost about 3x as much per chunk (7 vs 2 us)
    on the event loop, once per token per request. The output equals ``ChatCompletionChunk`` /
    ``CompletionResponse``'s ``model_dump`` encoded as compact JSON (a test checks it).
    """

    request_id: str  # the response id shared by every chunk
    created: int  # Unix seconds
    model: str  # the model string the client sent
    info: RevisionInfo  # the revision that answered
    chat: bool  # chat.completion.chunk (True) or text_completion (False)

    @cached_property
    def _head(self) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return (
            f'data: {{"id":{_json(self.request_id)},"object":"{kind}","created":{self.created},'
            f'"model":{_json(self.model)},"choices":['
        )

    @cached_property
    def _tail(self) -> str:
        info = _json(self.info.model_dump())
        return f'],"usage":null,"system_fingerprint":null,"loraplex":{info}}}\n\n'

    def _tail_with(self, usage: Usage | None) -> str:
        if usage is None:
            return self._tail
        return self._tail.replace('"usage":null', f'"usage":{_json(usage.model_dump())}', 1)

    def opening(self, num_choices: int = 1, usage: Usage | None = None) -> list[str]:
        """Events sent before any text (chat announces the assistant role of each choice);
        ``usage``: what each carries with ``continuous_usage_stats`` (no tokens generated)."""
        if not self.chat:
            return []
        delta = '{"role":"assistant","content":""}'
        return [
            f'{self._head}{{"index":{index},"delta":{delta},"logprobs":null,'
            f'"finish_reason":null,"stop_reason":null}}{self._tail_with(usage)}'
            for index in range(num_choices)
        ]

    def text(
        self,
        text: str,
        finish_reason: str | None,
        *,
        index: int = 0,
        logprobs: object = None,
        stop_reason: str | int | None = None,
        usage: Usage | None = None,
    ) -> str:
        """The event carrying one delta of choice ``index`` (``logprobs``: its JSON-ready
        value in the endpoint's shape; ``usage``: this choice's so far, or None)."""
        rest = (
            f'"logprobs":{_json(logprobs)},"finish_reason":{_json(finish_reason)},'
            f'"stop_reason":{_json(stop_reason)}}}'
        )
        if self.chat:  # content is a string, "" without text (as vLLM; never null)
            choice = f'{{"index":{index},"delta":{{"content":{_json(text)}}},{rest}'
        else:
            choice = f'{{"index":{index},"text":{_json(text)},{rest}'
        return f"{self._head}{choice}{self._tail_with(usage)}"

    def usage(self, usage: Usage) -> str:
        """The final event with token usage and no choices."""
        return f"{self._head}{self._tail_with(usage)}"


class StreamChoices:
    """Turns each sibling's deltas into events: choice index, echo, logprobs, usage.

    With ``continuous_usage`` (vLLM's ``stream_options.continuous_usage_stats``, honoured only
    together with ``include_usage``, as vLLM) every event of a choice carries that choice's
    usage so far: its prompt's tokens, the tokens it generated up to this event, and their sum
    (chat's opening events: 0 generated). The final usage event still sums every choice.
    """

    def __init__(
        self,
        fmt: ChunkFormat,
        siblings_per_prompt: int,
        num_top: int | None,
        strings: TokenStrings,
        echo: Sequence[Echo] | None = None,
        *,
        continuous_usage: bool = False,
    ) -> None:
        self.fmt = fmt
        self._per_prompt = siblings_per_prompt  # streams never rank: slot == choice index
        self._num_top = num_top  # logprobs the client asked for; None: none
        self._strings = strings
        self._echo = echo
        self._continuous = continuous_usage  # usage on every event, not only the last
        self._offsets: dict[int, ChoiceOffsets] = {}  # completions: each choice's text_offset
        self._last: dict[int, TokenDelta] = {}  # the latest delta of each choice (usage)

    def opening(self, num_choices: int, first: TokenDelta | None) -> list[str]:
        """Chat's role events, before any delta is shown (``first``: the delta already
        received; every choice of a chat request shares its one prompt)."""
        usage = None
        if self._continuous and first is not None:
            usage = _usage(first.prompt_tokens, 0)
        return self.fmt.opening(num_choices, usage)

    def heavy(self, slot: int, delta: TokenDelta) -> bool:
        """Whether the event of ``delta`` formats more than ``MAX_LOOP_LOGPROB_ENTRIES``
        logprob entries (with ``echo``: a choice's first event, its prompt's among them)."""
        if self._num_top is None:
            return False
        entries = len(delta.logprobs or ())
        if self._echo and slot not in self._last:
            entries += len(delta.prompt_logprobs or ())
        return entries > MAX_LOOP_LOGPROB_ENTRIES

    def event(self, slot: int, delta: TokenDelta) -> str | None:
        """``delta``'s event (None: nothing to show); counted in ``usage`` once formatted."""
        first = slot not in self._last
        text, entries = delta.text, list[TokenLogprob | None](delta.logprobs or ())
        echo = self._echo[slot // self._per_prompt] if self._echo and first else None
        num_prompt = 0
        if echo is not None:
            text = echo.text + text
            num_prompt = len(delta.prompt_logprobs or ())
            entries = [*(delta.prompt_logprobs or ()), *entries]
        if not (first or text or entries or delta.finish_reason is not None):
            self._last[slot] = delta
            return None
        usage = _usage(delta.prompt_tokens, delta.completion_tokens) if self._continuous else None
        out = self.fmt.text(
            text, delta.finish_reason, index=slot, stop_reason=delta.stop_reason,
            logprobs=self._logprobs(slot, entries, echo, num_prompt), usage=usage,
        )  # fmt: skip
        self._last[slot] = delta
        return out if echo is None else EchoEvent(out)  # bounded by the request, not the buffer

    def _logprobs(
        self, slot: int, entries: list[TokenLogprob | None], echo: Echo | None, num_prompt: int
    ) -> object:
        if self._num_top is None:
            return None
        if self.fmt.chat:
            chosen = [e for e in entries if e is not None]
            return {
                "content": [
                    c.model_dump() for c in chat_logprobs(chosen, self._strings, self._num_top)
                ]
            }
        first_id = echo.first_token_id if echo is not None else None
        offsets = self._offsets.get(slot)
        if offsets is None:  # a choice's first event (with its echo, if any)
            echo_chars = len(echo.text) if echo is not None else None
            offsets = self._offsets[slot] = ChoiceOffsets(self._strings, echo_chars)
        out = completion_logprobs(
            entries, self._strings, self._num_top, offsets,
            num_prompt=num_prompt, first_token_id=first_id,
        )  # fmt: skip
        return out.model_dump()

    @property
    def forwarded(self) -> bool:
        """Whether any delta was turned into an event (``usage`` counts those)."""
        return bool(self._last)

    def usage(self) -> Usage:
        """Every choice's tokens together, each prompt counted once (as vLLM), up to the last
        delta formatted."""
        prompts = {slot // self._per_prompt: d.prompt_tokens for slot, d in self._last.items()}
        num_prompt = sum(prompts.values())
        num_completion = sum(d.completion_tokens for d in self._last.values())
        return _usage(num_prompt, num_completion)


def _usage(num_prompt: int, num_completion: int) -> Usage:
    return Usage(
        prompt_tokens=num_prompt,
        completion_tokens=num_completion,
        total_tokens=num_prompt + num_completion,
    )


async def sse_events(
    first: Slotted | None,
    fanout: Fanout,
    choices: StreamChoices,
    num_choices: int,
    include_usage: bool,
    *,
    place: Callable[[], AbstractAsyncContextManager[None]],
) -> AsyncIterator[str]:
    """The event stream of one request, ``first`` being the delta already received. However
    it ends (done, failed, or cancelled because the client left), every sibling still running
    is aborted. ``place``: one of the tenant's places on the pool, for a heavy event.

    A stream that fails after its first event (its engine died, its fleet replica was lost)
    ends with an error event and no ``[DONE]``; with ``include_usage`` a usage event for the
    tokens forwarded so far comes just before it (on ``serve`` and a fleet's ingress alike).
    NOTE: before, such a stream had no usage event, so the client could not tell from it how
    many tokens it was counted (docs/benchmarks/fleetdeath.md)."""
    fmt = choices.fmt
    usage_sent = False
    try:
        for opening in choices.opening(num_choices, first[1] if first else None):
            yield opening
        item = first
        while item is not None:
            if choices.heavy(*item):  # NOTE: awaited before the next one: never two at once
                async with place():
                    event_text = await run_in_threadpool(choices.event, *item)
            else:
                event_text = choices.event(*item)
            if event_text is not None:
                yield event_text
            item = await anext(fanout, None)
        if include_usage:
            usage_sent = True
            yield fmt.usage(choices.usage())
        yield DONE
    except Exception as exc:  # any failure is an error event, never a silently cut stream
        if include_usage and not usage_sent and choices.forwarded:
            yield fmt.usage(choices.usage())  # what was forwarded, read before the error
        # to_api_error logs a bug under an id; its event names the id and nothing else.
        yield event(to_api_error(exc, ErrorContext.TENANT).body())
    finally:
        await fanout.abort()
