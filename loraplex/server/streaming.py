"""Server-sent events for both OpenAI endpoints, and the chunk shapes that differ between them.

A stream opens only after the engine produced its first delta (see ``serving.first_delta``), so
errors before it get a real HTTP status. An error after it cannot change the status any more: it
is sent as one ``data: {"error": ...}`` event (what the OpenAI clients raise on), and the stream
ends. If the client goes away, the response task is cancelled and the engine request aborted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from loraplex.engine.protocol import TokenDelta
from loraplex.errors import LoraplexError
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import ErrorContext, to_api_error
from loraplex.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
    RevisionInfo,
    Usage,
)
from loraplex.server.serving import abort_quietly, close_quietly

DONE = "data: [DONE]\n\n"


def usage_of(delta: TokenDelta) -> Usage:
    return Usage(
        prompt_tokens=delta.prompt_tokens,
        completion_tokens=delta.completion_tokens,
        total_tokens=delta.prompt_tokens + delta.completion_tokens,
    )


def event(payload: object) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


@dataclass(frozen=True)
class ChunkFormat:
    """How one endpoint shapes its stream chunks."""

    request_id: str  # the response id shared by every chunk
    created: int  # Unix seconds
    model: str  # the model string the client sent
    info: RevisionInfo  # the revision that answered
    chat: bool  # chat.completion.chunk (True) or text_completion (False)

    def opening(self) -> list[dict[str, object]]:
        """Chunks sent before any text (chat announces the assistant role first)."""
        if not self.chat:
            return []
        return [self._chat(ChatDelta(role="assistant", content=""), None, None)]

    def text(self, text: str, finish_reason: str | None) -> dict[str, object]:
        if self.chat:
            content = ChatDelta(content=text) if text else ChatDelta()
            return self._chat(content, finish_reason, None)
        choice = CompletionChoice(text=text, finish_reason=finish_reason)
        return self._completion([choice], None)

    def usage(self, usage: Usage) -> dict[str, object]:
        return self._chat(None, None, usage) if self.chat else self._completion([], usage)

    def _completion(
        self, choices: list[CompletionChoice], usage: Usage | None
    ) -> dict[str, object]:
        chunk = CompletionResponse(
            id=self.request_id, created=self.created, model=self.model,
            choices=choices, usage=usage, loraplex=self.info,
        )  # fmt: skip
        return chunk.model_dump()

    def _chat(
        self, delta: ChatDelta | None, finish_reason: str | None, usage: Usage | None
    ) -> dict[str, object]:
        choices = (
            [] if delta is None else [ChatChunkChoice(delta=delta, finish_reason=finish_reason)]
        )
        chunk = ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model,
            choices=choices, usage=usage, loraplex=self.info,
        )  # fmt: skip
        return chunk.model_dump()


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
        for payload in fmt.opening():
            yield event(payload)
        delta = first
        while delta is not None:
            if delta is first or delta.text or delta.finish_reason is not None:
                yield event(fmt.text(delta.text, delta.finish_reason))
            last = delta
            if delta.finish_reason is not None:
                break
            delta = await anext(stream, None)
        ended = True
        if include_usage and last is not None:
            yield event(fmt.usage(usage_of(last)))
        yield DONE
    except LoraplexError as exc:
        ended = True
        yield event(to_api_error(exc, ErrorContext.TENANT).body())
    finally:
        if ended:
            await close_quietly(stream)
        else:
            await abort_quietly(deps, fmt.request_id, stream)
