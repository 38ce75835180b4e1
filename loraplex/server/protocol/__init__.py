"""OpenAI-compatible request and response bodies (the subset loraplex serves).

Nothing is silently ignored: an unknown field is a 400 naming it (unlike vLLM, which ignores
it), and a field loraplex knows but does not implement is accepted only at its neutral value
(``NEUTRAL``). vLLM's sampling extensions it lists are honoured (docs/operations.md). No
request field is a filesystem path or URL: ``model`` is a name the registry resolves.
Every response carries ``loraplex.revision``: the exact ``tenant/name@revision`` that answered,
and ``loraplex.tier``: the tier the engine leased that revision from (what the request's latency
paid for; where it was cached on arrival only if the engine never reported a tier).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt

from loraplex.errors import clipped
from loraplex.sampling import (  # the engine's own bounds, so the two layers cannot disagree
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MAX_STOP_TOKEN_IDS,
    MIN_REPETITION_PENALTY,
    MIN_SEED,
)


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
MAX_STOP_STRINGS = 4  # OpenAI's limit
StopText = Annotated[Text, Field(max_length=MAX_STOP_CHARS)]

# Lists and maps a tenant sends are bounded in the schema. NOTE: pydantic stops reading a list at
# its ``max_length``, but it reports every wrong item of a shorter one, so a union member given
# 65,536 wrong items builds 65,536 errors on the event loop; ``_token_ids`` stops at the first.
MAX_BATCH_PROMPTS = 16  # prompts in one completions request (= choices.DEFAULT_MAX_CHOICES)
MAX_TOKEN_IDS = 1 << 16  # ids in one token-id list (the context length check still follows)
MAX_CHAT_MESSAGES = 1024  # messages in one conversation
MAX_CONTENT_PARTS = 16  # text parts in one message's content


def _check_count(value: object, limit: int, what: str) -> object:
    """A plain message for a list past ``limit`` (a union's members would each report it in
    their own words, the first of them usually "Input should be a valid string")."""
    if isinstance(value, list) and len(value) > limit:
        raise ValueError(f"has {len(value)} {what}; expected at most {limit}")
    return value


def _token_ids(value: object) -> object:
    """The first item that is not an id >= 0 ends validation (one error, not one per item)."""
    if not isinstance(value, list):
        return value
    if len(value) > MAX_TOKEN_IDS:
        raise ValueError(f"has {len(value)} token ids; expected at most {MAX_TOKEN_IDS}")
    for index, item in enumerate(value):
        if type(item) is not int or item < 0:  # NOTE: bool is an int subclass; refused too
            shown = clipped(str(item)) if type(item) is int else f"a {type(item).__name__}"
            raise ValueError(f"item {index} is {shown}; expected a token id >= 0")
    return value


# A list of token ids >= 0 (below the vocabulary size too, checked by the route).
TokenIds = Annotated[
    list[Annotated[StrictInt, Field(ge=0)]],
    Field(max_length=MAX_TOKEN_IDS),
    BeforeValidator(_token_ids),
]

# ---- requests ----------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False  # send a final chunk with the usage of every choice together
    # vLLM extension: with include_usage, every chunk also carries its choice's usage so far
    # (alone it changes nothing, as in vLLM)
    continuous_usage_stats: bool = False


MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top alternatives per token (vLLM's default too)
TopLogprobs = Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)]


class SamplingFields(BaseModel):
    """Fields shared by both endpoints (OpenAI's defaults; vLLM's ranges for its extensions;
    null means the default).

    Nothing is silently ignored: a field loraplex does not know is a 400 naming it
    (``extra="forbid"``), and a known field it does not implement is accepted only at the value
    that changes nothing (``NEUTRAL``), so clients that send defaults explicitly keep working.
    """

    model_config = ConfigDict(extra="forbid")

    model: Text = Field(min_length=1, max_length=512)  # alias, tenant/name, ...@revision, or base
    max_tokens: int | None = Field(default=None, ge=1)  # None: the endpoint's default
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)  # below 1e-5: greedy (as vLLM)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)  # nucleus mass
    stop: Annotated[  # up to 4 (OpenAI's limit), 1024 chars each
        StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None,
        BeforeValidator(lambda value: _check_count(value, MAX_STOP_STRINGS, "stop strings")),
    ] = None
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)  # choice i uses seed + i
    stream: bool = False  # server-sent events
    stream_options: StreamOptions | None = None  # include_usage, continuous_usage_stats
    n: StrictInt | None = Field(
        default=1, ge=1
    )  # choices per prompt (at most the server's max_choices)
    user: Text | None = Field(default=None, max_length=256)  # keeps a caller on one revision
    ignore_eos: bool = False  # vLLM extension: generate past end-of-sequence tokens
    min_tokens: int = Field(default=0, ge=0)  # vLLM extension: no EOS / stop before this many
    top_k: int | None = Field(default=None, ge=-1)  # keep the k most likely; -1, 0, None: off
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(  # vLLM: any value > 0 (see SamplingParams)
        default=1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY
    )
    min_p: float | None = Field(default=0.0, ge=0.0, le=1.0)  # vLLM extension
    logit_bias: dict[str, float] | None = Field(  # token id (a string) -> bias in [-100, 100]
        default=None, max_length=MAX_LOGIT_BIAS_ENTRIES
    )
    stop_token_ids: list[StrictInt] | None = Field(  # vLLM extension
        default=None, max_length=MAX_STOP_TOKEN_IDS
    )
    include_stop_str_in_output: bool | None = False  # vLLM extension

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        values = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if any(not value for value in values):
            raise ValueError("stop contains an empty string; expected non-empty strings")
        return tuple(values)

    @property
    def num_choices(self) -> int:
        """``n`` (null: 1)."""
        return 1 if self.n is None else self.n

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk: vLLM honours ``continuous_usage_stats`` only together with
        ``include_usage``."""
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )


def _prompt_shape(value: object) -> object:
    """One plain message for a malformed or oversized prompt, told apart by its first item
    (the union's members would each report it, one error per wrong item, in their own words)."""
    if not isinstance(value, list) or not value:
        return value
    first = value[0]
    if type(first) is int:
        return _token_ids(value)
    _check_count(value, MAX_BATCH_PROMPTS, "prompts")
    if isinstance(first, list):
        for index, item in enumerate(value):
            if not isinstance(item, list):
                raise ValueError(f"item {index} is a {type(item).__name__}; expected token ids")
            try:
                _token_ids(item)
            except ValueError as exc:
                raise ValueError(f"prompt {index} {exc}") from None
    return value


# One prompt: text, or token ids; a batch: a list of either (one choice per prompt x n).
Prompt = Annotated[
    Text
    | Annotated[list[Text], Field(max_length=MAX_BATCH_PROMPTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(max_length=MAX_BATCH_PROMPTS)],
    BeforeValidator(_prompt_shape),
]


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: int | None = Field(default=16, ge=0)  # OpenAI's default; 0 only with echo
    logprobs: TopLogprobs | None = None  # top-N per token (0: only the chosen token's)
    echo: bool | None = False  # the prompt (and its logprobs) comes before the generated text
    best_of: StrictInt | None = Field(default=None, ge=1)  # generated per prompt; best n returned
    # Not implemented: accepted only at their neutral values (``NEUTRAL``), else a 400.
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]  # only text parts are supported
    text: Text


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[
        Text | Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS)] | None,
        BeforeValidator(lambda value: _check_count(value, MAX_CONTENT_PARTS, "text parts")),
    ] = None
    name: Text | None = Field(default=None, max_length=256)  # participant's name, for the template

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
    max_completion_tokens: int | None = Field(default=None, ge=1)  # newer name of max_tokens
    logprobs: bool | None = False  # each output token's logprob
    top_logprobs: TopLogprobs | None = None  # and this many alternatives (needs logprobs true)
    # Not implemented: accepted only at their neutral values (``NEUTRAL``), else a 400.
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    response_format: dict[str, object] | None = None  # no structured output (operations.md)
    add_generation_prompt: bool | None = None  # vLLM extension (the template always adds it)
    # Handed to the chat template as vLLM does (``chat.ChatTemplate.render``).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    parallel_tool_calls: bool | None = None  # no tools are accepted, so either value is neutral
    # OpenAI platform settings: loraplex stores no completions and has one service tier.
    store: bool | None = None
    metadata: dict[str, object] | None = Field(default=None, max_length=16)  # OpenAI's cap
    service_tier: str | None = Field(default=None, max_length=32)


# Fields loraplex does not implement, with the values that change nothing (any other value is a
# 400 naming the field). ``None`` (absent or null) is always neutral.
NEUTRAL: dict[str, tuple[object, ...]] = {
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "response_format": ({"type": "text"},),
    "add_generation_prompt": (True,),
    "parallel_tool_calls": (True, False),
    "store": (False,),
    "metadata": ({},),
    "service_tier": ("auto", "default"),
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


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions shape: one entry per token in each list (with ``echo``, the
    prompt's tokens first, the first of them without a logprob)."""

    text_offset: list[int]  # where each token starts in the choice's text
    token_logprobs: list[float | None]  # the chosen token's logprob
    tokens: list[str]  # each token as the tokenizer decodes it alone
    top_logprobs: list[dict[str, float] | None]  # the top-N and the chosen token


class TopLogprob(BaseModel):
    token: str  # the tokenizer's decoding of this one token
    logprob: float
    bytes: list[int] | None  # UTF-8 of ``token``


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]  # the most likely tokens at this position, best first


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    stop_reason: str | int | None = None  # vLLM: the stop string or token id; None: EOS


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
    role: Literal["assistant"] | None = None
    content: str | None = None


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


class ModelCard(BaseModel):
    """One entry of /v1/models."""

    id: str  # what to send as ``model``
    object: Literal["model"] = "model"
    created: int  # Unix seconds
    owned_by: str  # owning tenant ("loraplex" for the base model)
    root: str  # tenant/name of an adapter (tenant/name@revision when pinned); the base model's name
    parent: str | None  # the base model for adapters; None for the base model
    max_model_len: int | None  # prompt + output tokens one sequence may hold; None: not known


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- tokenize / admin ---------------------------------------------------------------------------


class TokenizeRequest(BaseModel):
    """POST /tokenize: vLLM's two shapes in one body, ``prompt`` or chat ``messages``."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = Field(default=None, min_length=1, max_length=512)  # None: the base model
    prompt: Text | None = None  # text, encoded as /v1/completions encodes it
    messages: Messages | None = None  # chat template
    add_generation_prompt: bool | None = None  # messages only; only true (the template adds it)
    add_special_tokens: bool | None = None  # only the encoding generation uses (module docstring)
    return_token_strs: bool = False  # also return each token id decoded alone


class TokenizeResponse(BaseModel):
    count: int  # number of tokens
    max_model_len: int | None  # the served context length; None: not known
    tokens: list[int]  # token ids, exactly as generation would see the prompt
    token_strs: list[str] | None = None  # each id decoded alone (with ``return_token_strs``)


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = Field(default=None, min_length=1, max_length=512)  # None: the base model
    tokens: TokenIds  # ids below the vocabulary size


class DetokenizeResponse(BaseModel):
    prompt: str  # the text the ids decode to (special tokens skipped, as in outputs)


class LoadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/load_lora_adapter (admin credential, admin listener)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=512)  # tenant/name or tenant/name@revision
    lora_path: str = Field(min_length=1, max_length=4096)  # a folder inside the import directory


class UnloadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/unload_lora_adapter (admin credential, admin listener)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=512)  # tenant/name or tenant/name@revision


class LoraAdapterLoaded(BaseModel):
    lora_name: str  # as sent
    model: str  # tenant/name@revision: the exact revision registered (send it as ``model``)
    created: bool  # False: these bytes were already registered under that revision
    tier: str  # the tier it was asked into ("L1": CPU memory)
    status: Literal["resident", "deferred"]  # deferred: the cache declined to load it now
    message: str  # human-readable outcome


class LoraAdapterUnloaded(BaseModel):
    lora_name: str  # as sent
    evicted: dict[str, list[str]]  # tenant/name@revision -> tiers a copy was dropped from
    message: str  # human-readable outcome
