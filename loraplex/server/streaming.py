"""Server-sent events for both OpenAI endpoints, and the chunk shapes that differ between them.

A stream opens only after the engine produced its first delta (see ``serving.first_delta``), so
errors before it get a real HTTP status. An error after it cannot change the status any more:
whatever its type (a domain error or a bug), it is sent as one ``data: {"error": ...}`` event
(what the OpenAI clients raise on), mapped by ``server/errors.py`` like a status would be, and
the stream ends. If the client goes away, the response task is cancelled and the engine request
aborted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cached_property

from loraplex.engine.protocol import TokenDelta
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import ErrorContext, to_api_error
from loraplex.server.protocol import RevisionInfo, Usage
from loraplex.server.serving import abort_quietly, close_quietly

DONE = "data: [DONE]\n\n"


def usage_of(delta: TokenDelta) -> Usage:
    return Usage(
        prompt_tokens=delta.prompt_tokens,
        completion_tokens=delta.completion_tokens,
        total_tokens=delta.prompt_tokens + delta.completion_tokens,
    )


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def event(payload: object) -> str:
    return f"data: {_json(payload)}\n\n"


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

    def opening(self) -> list[str]:
        """Events sent before any text (chat announces the assistant role first)."""
        if not self.chat:
            return []
        delta = '{"role":"assistant","content":""}'
        return [
            f'{self._head}{{"index":0,"delta":{delta},"logprobs":null,'
            f'"finish_reason":null}}{self._tail}'
        ]

    def text(self, text: str, finish_reason: str | None) -> str:
        """The event carrying one delta's text."""
        reason = _json(finish_reason)
        if self.chat:
            content = _json(text) if text else "null"
            choice = (
                f'{{"index":0,"delta":{{"role":null,"content":{content}}},"logprobs":null,'
                f'"finish_reason":{reason}}}'
            )
        else:
            choice = f'{{"index":0,"text":{_json(text)},"logprobs":null,"finish_reason":{reason}}}'
        return f"{self._head}{choice}{self._tail}"

    def usage(self, usage: Usage) -> str:
        """The final event with token usage and no choices."""
        tail = self._tail.replace('"usage":null', f'"usage":{_json(usage.model_dump())}', 1)
        return f"{self._head}{tail}"


async def sse_events(
    first: TokenDelta | None,
    stream: AsyncIterator[TokenDelta],
    fmt: ChunkFormat,
    include_usage: bool,
    deps: ServerDeps,
) -> AsyncIterator[str]:
    """The event stream of one request, ``first`` being the delta already received."""
    last, ended = first, first is None
    try:
        for opening in fmt.opening():
            yield opening
        delta = first
        while delta is not None:
            if delta is first or delta.text or delta.finish_reason is not None:
                yield fmt.text(delta.text, delta.finish_reason)
            last = delta
            if delta.finish_reason is not None:
                break
            delta = await anext(stream, None)
        ended = True
        if include_usage and last is not None:
            yield fmt.usage(usage_of(last))
        yield DONE
    except Exception as exc:  # any failure is an error event, never a silently cut stream
        ended = True
        # to_api_error logs a bug under an id; its event names the id and nothing else.
        yield event(to_api_error(exc, ErrorContext.TENANT).body())
    finally:
        if ended:
            await close_quietly(stream)
        else:
            await abort_quietly(deps, fmt.request_id, stream)
