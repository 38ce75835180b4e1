"""SSE chunks are assembled from strings; they must equal the pydantic models' JSON."""

from __future__ import annotations

import json

import pytest

from loraplex.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
    RevisionInfo,
    Usage,
)
from loraplex.server.streaming import ChunkFormat

INFO = RevisionInfo(revision="acme/support@r1", adapter_digest="ab" * 32, tier="L1")
TEXTS = ["", "plain", 'quo"te \\ back', "é ünïcode \u2028 and \n newline", "\ufffd"]


def _sse(model: CompletionResponse | ChatCompletionChunk) -> str:
    return f"data: {json.dumps(model.model_dump(), separators=(',', ':'))}\n\n"


def _fmt(chat: bool, model: str = 'm"odel') -> ChunkFormat:
    return ChunkFormat("cmpl-1", 1700000000, model, INFO, chat)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("reason", [None, "stop", "length"])
def test_completion_chunks_equal_the_model(text: str, reason: str | None) -> None:
    expected = CompletionResponse(
        id="cmpl-1", created=1700000000, model='m"odel', loraplex=INFO,
        choices=[CompletionChoice(text=text, finish_reason=reason)],
    )  # fmt: skip
    assert _fmt(False).text(text, reason) == _sse(expected)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("reason", [None, "stop"])
def test_chat_chunks_equal_the_model(text: str, reason: str | None) -> None:
    delta = ChatDelta(content=text)
    expected = ChatCompletionChunk(
        id="cmpl-1", created=1700000000, model='m"odel', loraplex=INFO,
        choices=[ChatChunkChoice(delta=delta, finish_reason=reason)],
    )  # fmt: skip
    assert _fmt(True).text(text, reason) == _sse(expected)


def test_chat_opening_announces_the_assistant() -> None:
    expected = ChatCompletionChunk(
        id="cmpl-1", created=1700000000, model='m"odel', loraplex=INFO,
        choices=[ChatChunkChoice(delta=ChatDelta(role="assistant", content=""),
                                 finish_reason=None)],
    )  # fmt: skip
    assert _fmt(True).opening() == [_sse(expected)]
    assert _fmt(False).opening() == []


@pytest.mark.parametrize("chat", [False, True])
def test_usage_chunk_equals_the_model(chat: bool) -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=5, total_tokens=8)
    model: ChatCompletionChunk | CompletionResponse
    if chat:
        model = ChatCompletionChunk(
            id="cmpl-1", created=1700000000, model="usage", loraplex=INFO, choices=[], usage=usage
        )
    else:
        model = CompletionResponse(
            id="cmpl-1", created=1700000000, model="usage", loraplex=INFO, choices=[], usage=usage
        )
    # A model named like the field must not confuse the usage substitution.
    assert _fmt(chat, model="usage").usage(usage) == _sse(model)


@pytest.mark.parametrize("chat", [False, True])
def test_a_chunk_with_continuous_usage_equals_the_model(chat: bool) -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)
    model: ChatCompletionChunk | CompletionResponse
    if chat:
        model = ChatCompletionChunk(
            id="cmpl-1", created=1700000000, model="usage", loraplex=INFO, usage=usage,
            choices=[ChatChunkChoice(delta=ChatDelta(content="x"), finish_reason=None)],
        )  # fmt: skip
    else:
        model = CompletionResponse(
            id="cmpl-1", created=1700000000, model="usage", loraplex=INFO, usage=usage,
            choices=[CompletionChoice(text="x", finish_reason=None)],
        )  # fmt: skip
    assert _fmt(chat, model="usage").text("x", None, usage=usage) == _sse(model)
    if chat:
        opening = model.model_copy(
            update={
                "choices": [ChatChunkChoice(delta=ChatDelta(role="assistant", content=""),
                                            finish_reason=None)],
            }
        )  # fmt: skip
        assert _fmt(chat, model="usage").opening(1, usage) == [_sse(opening)]
