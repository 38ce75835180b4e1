"""POST /v1/chat/completions: its request (a bounded conversation of text messages), its
response and its stream chunks."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    model_serializer,
)

from loraplex.server.protocol.fields import (
    MAX_CHAT_MESSAGES,
    MAX_CONTENT_PARTS,
    NameText,
    RevisionInfo,
    SamplingFields,
    TenantBody,
    Text,
    TopLogprobs,
    Usage,
    _check_count,
    neutral_only,
)


class TextPart(TenantBody):
    type: Literal["text"]  # only text parts are supported
    text: Text


class ChatMessageIn(TenantBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[
        Text | Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS)] | None,
        BeforeValidator(lambda value: _check_count(value, MAX_CONTENT_PARTS, "text parts")),
    ] = None
    name: NameText | None = None  # participant's name, for the template

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


# A conversation: bounded before any message is parsed past the cap (the chat template and the
# tokenizer then see at most this many; ``chat.num_prompt_chars`` charges each one).
Messages = Annotated[list[ChatMessageIn], Field(min_length=1, max_length=MAX_CHAT_MESSAGES)]


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: Messages
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # newer name of max_tokens
    logprobs: StrictBool | None = False  # each output token's logprob
    top_logprobs: TopLogprobs | None = None  # and this many alternatives (needs logprobs true)
    # Not implemented: accepted only at their neutral values (``NEUTRAL``), else a 400.
    # Any JSON: refused unless neutral before the schema reads it (``neutral_only``).
    tools: Annotated[list[dict[str, object]] | None, neutral_only("tools")] = None
    tool_choice: Annotated[str | dict[str, object] | None, neutral_only("tool_choice")] = None
    response_format: Annotated[  # no structured output (operations.md)
        dict[str, object] | None, neutral_only("response_format")
    ] = None
    add_generation_prompt: StrictBool | None = None  # vLLM extension (the template always adds it)
    # Handed to the chat template as vLLM does (``chat.ChatTemplate.render``).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    # no tools are accepted, so either value is neutral
    parallel_tool_calls: StrictBool | None = None
    # OpenAI platform settings: loraplex stores no completions and has one service tier.
    store: StrictBool | None = None
    metadata: Annotated[dict[str, object] | None, neutral_only("metadata")] = None
    service_tier: str | None = Field(default=None, max_length=32)


class TopLogprob(BaseModel):
    token: str  # the tokenizer's decoding of this one token
    logprob: float
    bytes: list[int] | None  # UTF-8 of ``token``


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]  # the most likely tokens at this position, best first


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    # OpenAI's response message requires the key (null unless the model refused; vLLM sends
    # null): loraplex has no refusals. NOTE: it was left out (docs/benchmarks/vllmdiff.md).
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: str | int | None = None  # vLLM: the stop string or token id; None: EOS


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    loraplex: RevisionInfo


class ChatDelta(BaseModel):
    """One choice's delta. Only a choice's first delta names the role; later ones leave the
    key out rather than send ``"role": null`` (as OpenAI and vLLM do). ``content`` is always a
    string, ``""`` on a delta without text (as vLLM; OpenAI leaves the key out of its finishing
    delta): never null, so a client appending it never meets None."""

    role: Literal["assistant"] | None = None  # "assistant" on the first delta, else left out
    content: str = ""  # the delta's text

    @model_serializer(mode="wrap")
    def _without_null_role(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        if self.role is None:
            data.pop("role", None)
        return data


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: str | int | None = None  # on the last chunk of a choice


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    loraplex: RevisionInfo
