"""OpenAI-compatible request and response bodies (the subset loraplex serves).

Nothing is silently ignored: an unknown field is a 400 naming it (unlike vLLM, which ignores
it), and a field loraplex knows but does not implement is accepted only at its neutral value
(``NEUTRAL``). vLLM's ``ignore_eos``, ``min_tokens`` and ``top_k`` are honoured. No
request field is a filesystem path or URL: ``model`` is a name the registry resolves.
Every response carries ``loraplex.revision``: the exact ``tenant/name@revision`` that answered,
and ``loraplex.tier``: the tier the engine leased that revision from (what the request's latency
paid for; where it was cached on arrival only if the engine never reported a tier).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from loraplex.sampling import MAX_SEED, MIN_SEED  # the range torch's generators accept


def _valid_utf8(value: str) -> str:
    """A lone surrogate (``"\\ud800"`` in JSON) cannot be encoded, so no tokenizer can take it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate; expected valid Unicode text") from None
    return value


# Text a tenant sends: valid Unicode (checked before anything is tokenized).
Text = Annotated[str, AfterValidator(_valid_utf8)]
MAX_STOP_CHARS = 1024  # one stop string (each is searched for in the output after every token)
StopText = Annotated[Text, Field(max_length=MAX_STOP_CHARS)]

# ---- requests ----------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False  # send a final chunk with token usage


class SamplingFields(BaseModel):
    """Fields shared by both endpoints (OpenAI's defaults).

    Nothing is silently ignored: a field loraplex does not know is a 400 naming it
    (``extra="forbid"``), and a known field it does not implement is accepted only at the value
    that changes nothing (``NEUTRAL``), so clients that send defaults explicitly keep working.
    """

    model_config = ConfigDict(extra="forbid")

    model: Text = Field(min_length=1, max_length=512)  # alias, tenant/name, ...@revision, or base
    max_tokens: int | None = Field(default=None, ge=1)  # None: the endpoint's default
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)  # below 1e-5: greedy (as vLLM)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)  # nucleus mass
    stop: StopText | list[StopText] | None = None  # up to 4 (OpenAI's limit), 1024 chars each
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)  # seeds the sampler
    stream: bool = False  # server-sent events
    stream_options: StreamOptions | None = None  # include_usage
    n: int = 1  # only 1 is supported
    user: Text | None = Field(default=None, max_length=256)  # accepted and ignored
    ignore_eos: bool = False  # vLLM extension: generate past end-of-sequence tokens
    min_tokens: int = Field(default=0, ge=0)  # vLLM extension: no EOS / stop before this many
    top_k: int | None = Field(default=None, ge=-1)  # keep the k most likely; -1, 0, None: off
    # Not implemented: accepted only at their neutral values (``NEUTRAL``), else a 400.
    logprobs: bool | int | None = None  # completions send an int, chat a bool
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM extension
    min_p: float | None = None  # vLLM extension
    logit_bias: dict[str, float] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extension
    include_stop_str_in_output: bool | None = None  # vLLM extension

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        values = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(values) > 4:
            raise ValueError(f"stop has {len(values)} strings; expected at most 4")
        if any(not value for value in values):
            raise ValueError("stop contains an empty string; expected non-empty strings")
        return tuple(values)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: Text | list[Text] | list[int]  # one text prompt, or one already tokenized
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    # Not implemented: accepted only at their neutral values (``NEUTRAL``), else a 400.
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]  # only text parts are supported
    text: Text


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = Field(default=None, max_length=256)  # participant's name, for the template

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # newer name of max_tokens
    # Not implemented: accepted only at their neutral values (``NEUTRAL``), else a 400.
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    response_format: dict[str, object] | None = None
    add_generation_prompt: bool | None = None  # vLLM extension (the template always adds it)


# Fields loraplex does not implement, with the values that change nothing (any other value is a
# 400 naming the field). ``None`` (absent or null) is always neutral.
NEUTRAL: dict[str, tuple[object, ...]] = {
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "logit_bias": ({},),
    "stop_token_ids": ([],),
    "include_stop_str_in_output": (False,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "response_format": ({"type": "text"},),
    "add_generation_prompt": (True,),
}


# ---- responses ---------------------------------------------------------------------------------


class RevisionInfo(BaseModel):
    """Which adapter revision answered (None fields: the base model answered)."""

    revision: str | None  # tenant/name@revision
    adapter_digest: str | None  # sha256 of the revision's adapter_model.safetensors
    tier: str | None = None  # "L0".."L3": the tier the engine leased it from; None: base model


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    loraplex: RevisionInfo


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: str | None


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
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    loraplex: RevisionInfo


class ModelCard(BaseModel):
    """One entry of /v1/models."""

    id: str  # what to send as ``model``
    object: Literal["model"] = "model"
    created: int  # Unix seconds
    owned_by: str  # owning tenant ("loraplex" for the base model)
    root: str  # tenant/name of an adapter; the base model's own name
    parent: str | None  # the base model for adapters; None for the base model


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
