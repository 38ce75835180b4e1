"""What every OpenAI endpoint's body shares: tenant text (valid Unicode), bounded lists of
token ids, the sampling fields of both generation endpoints with the fields accepted only at
their neutral values, and the revision and usage blocks of every response."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)

from loraplex.errors import clipped, quoted
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


def _valid_utf8_str(value: object) -> object:
    """``_valid_utf8`` of a str, before a constrained str schema reads it; other values left to
    the schema's type error."""
    return _valid_utf8(value) if isinstance(value, str) else value


# Text a tenant sends: valid Unicode (checked before anything is tokenized).
Text = Annotated[str, AfterValidator(_valid_utf8)]
MAX_STOP_CHARS = 1024  # one stop string (each is searched for in the output after every token)
MAX_STOP_STRINGS = 4  # OpenAI's limit
# NOTE: the length is the str schema's own constraint ("String should have at most 1024
# characters"); on ``Text`` it became a generic check after the validator ("Value should have at
# most 1024 items"). The surrogate check runs before it: pydantic's constrained str cannot read
# a lone surrogate ("unable to parse raw data as a unicode string").
StopText = Annotated[str, Field(max_length=MAX_STOP_CHARS), BeforeValidator(_valid_utf8_str)]
MAX_NAME_CHARS = 256  # ``user`` and a chat message's ``name``
NameText = Annotated[str, Field(max_length=MAX_NAME_CHARS), BeforeValidator(_valid_utf8_str)]

# Lists and maps a tenant sends are bounded in the schema. NOTE: pydantic stops reading a list at
# its ``max_length``, but it reports every wrong item of a shorter one, so a union member given
# 65,536 wrong items builds 65,536 errors on the event loop; ``_token_ids`` stops at the first.
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


class FirstUnknownKeyBody(BaseModel):
    """An object a client sends: a key it does not know is a 400 naming it (``extra="forbid"``),
    and only the first such key is reported.

    pydantic reports every unknown key, and FastAPI copies each report, on the event loop: a body
    within ``max_body_bytes`` holding 200,000 unknown keys held every tenant's requests for
    0.7-16 s (by load) before its 400. Keeping the known keys and the first unknown one leaves
    one error to build (docs/operations.md, *Failure isolation*). The admin's bodies
    (``server/admin_models.py``, ``lora_admin.py``) are built on it too: the admin is trusted,
    but a large body of its would hold the same event loop.
    """

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _first_unknown_key_only(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        known = _known_keys(cls)
        kept: dict[object, object] = {}
        unknown = False
        for key, value in data.items():
            if key in known:
                kept[key] = value
            elif not unknown:
                kept[key] = value
                unknown = True
        return kept if unknown else data


class TenantBody(FirstUnknownKeyBody):
    """An object a tenant sends (every OpenAI body and its nested objects)."""


_KNOWN_KEYS: dict[type[BaseModel], frozenset[str]] = {}


def _known_keys(model: type[BaseModel]) -> frozenset[str]:
    """The keys ``model`` reads: its field names and their aliases."""
    known = _KNOWN_KEYS.get(model)
    if known is None:
        names = set(model.model_fields)
        for field in model.model_fields.values():
            names.update(a for a in (field.alias, field.validation_alias) if isinstance(a, str))
        known = _KNOWN_KEYS[model] = frozenset(names)
    return known


class StreamOptions(TenantBody):
    include_usage: StrictBool = False  # send a final chunk with the usage of every choice together
    # vLLM extension: with include_usage, every chunk also carries its choice's usage so far
    # (alone it changes nothing, as in vLLM)
    continuous_usage_stats: StrictBool = False


MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top alternatives per token (vLLM's default too)
TopLogprobs = Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)]


class SamplingFields(TenantBody):
    """Fields shared by both endpoints (OpenAI's defaults; vLLM's ranges for its extensions;
    null means the default).

    Nothing is silently ignored: a field loraplex does not know is a 400 naming it
    (``extra="forbid"``), and a known field it does not implement is accepted only at the value
    that changes nothing (``NEUTRAL``), so clients that send defaults explicitly keep working.
    """

    model: Text = Field(min_length=1, max_length=512)  # alias, tenant/name, ...@revision, or base
    max_tokens: StrictInt | None = Field(default=None, ge=1)  # None: the endpoint's default
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)  # below 1e-5: greedy (as vLLM)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)  # nucleus mass
    stop: Annotated[  # up to 4 (OpenAI's limit), 1024 chars each
        StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None,
        BeforeValidator(lambda value: _check_count(value, MAX_STOP_STRINGS, "stop strings")),
    ] = None
    seed: StrictInt | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)  # choice i uses seed + i
    stream: StrictBool = False  # server-sent events
    stream_options: StreamOptions | None = None  # include_usage, continuous_usage_stats
    n: StrictInt | None = Field(
        default=1, ge=1
    )  # choices per prompt (at most the server's max_choices)
    user: NameText | None = None  # keeps a caller on one revision
    ignore_eos: StrictBool = False  # vLLM extension: generate past end-of-sequence tokens
    min_tokens: StrictInt = Field(default=0, ge=0)  # vLLM extension: no EOS / stop before this many
    top_k: StrictInt | None = Field(default=None, ge=-1)  # keep the k most likely; -1, 0, None: off
    presence_penalty: StrictFloat | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: StrictFloat | None = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: StrictFloat | None = Field(  # vLLM: any value > 0 (see SamplingParams)
        default=1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY
    )
    min_p: StrictFloat | None = Field(default=0.0, ge=0.0, le=1.0)  # vLLM extension
    logit_bias: dict[str, StrictFloat] | None = Field(  # token id (a string) -> bias in [-100, 100]
        default=None, max_length=MAX_LOGIT_BIAS_ENTRIES
    )
    stop_token_ids: list[StrictInt] | None = Field(  # vLLM extension
        default=None, max_length=MAX_STOP_TOKEN_IDS
    )
    include_stop_str_in_output: StrictBool | None = False  # vLLM extension

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


def same_value(value: object, neutral: object) -> bool:
    """Equal and of the same kind (``True == 1`` must not pass for ``best_of``)."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


def unsupported(field: str, value: object) -> str:
    """Why ``value`` of ``field`` (not implemented, ``NEUTRAL``) is refused: it would change the
    output. The value is shown by its first items (``quoted``); the caller names the field."""
    accepted = ", ".join(map(repr, NEUTRAL[field]))
    return (
        f"{quoted(value)} is not supported; loraplex refuses what it does not implement "
        f"(accepted: null or {accepted})"
    )


def neutral_only(field: str) -> BeforeValidator:
    """Refuses ``field`` at any value but null and its neutral ones before its schema reads the
    value. NOTE: ``tools`` and ``metadata`` hold any JSON: a 3 MiB ``tools`` of 700,000 empty
    objects was validated (92 ms) and shown in full by ``repr`` (57 ms) on the event loop, and 8
    connections of one tenant sending it held another tenant's 1-token completion 2.5 s at the
    median, for a field whose only accepted value is ``[]``."""

    def check(value: object) -> object:
        if value is None or any(same_value(value, n) for n in NEUTRAL[field]):
            return value
        raise ValueError(unsupported(field, value))

    return BeforeValidator(check)


class RevisionInfo(BaseModel):
    """Which adapter revision answered (None fields: the base model answered)."""

    revision: str | None  # tenant/name@revision
    adapter_digest: str | None  # sha256 of the revision's adapter_model.safetensors
    tier: str | None = None  # "L0".."L3": the tier the engine leased it from; None: base model


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
