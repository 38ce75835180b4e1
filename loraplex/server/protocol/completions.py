"""POST /v1/completions: its request (a prompt, or a batch of them, as text or token ids) and
its response."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, StrictBool, StrictInt

from loraplex.server.batch_limit import MAX_BATCH_PROMPTS
from loraplex.server.protocol.fields import (
    MAX_TOKEN_IDS,
    RevisionInfo,
    SamplingFields,
    Text,
    TokenIds,
    TopLogprobs,
    Usage,
    _check_count,
    _token_ids,
)


def _prompt_shape(value: object) -> object:
    """One plain message for a malformed or oversized prompt, told apart by its first item
    (the union's members would each report it, one error per wrong item, in their own words)."""
    if not isinstance(value, list) or not value:
        return value
    first = value[0]
    if type(first) is int:
        try:
            return _token_ids(value)
        except ValueError:
            if len(value) <= MAX_TOKEN_IDS:
                _refuse_a_mix(value)
            raise
    _check_count(value, MAX_BATCH_PROMPTS, "prompts")
    _refuse_a_mix(value)
    if isinstance(first, str):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise ValueError(f"item {index} is a {type(item).__name__}; expected text")
    if isinstance(first, list):
        for index, item in enumerate(value):
            if not isinstance(item, list):
                raise ValueError(f"item {index} is a {type(item).__name__}; expected token ids")
            try:
                _token_ids(item)
            except ValueError as exc:
                raise ValueError(f"prompt {index} {exc}") from None
    return value


def _refuse_a_mix(value: list[object]) -> None:
    """A list holding both text and token ids (ids, or lists of them) is refused as a mix,
    naming the first item of each. NOTE: it was refused for its text alone ("item 0 is a str;
    expected a token id >= 0", the token-id member's error), which read as if text prompts
    were not taken (docs/benchmarks/vllmdiff.md). vLLM refuses the mix too (a 400)."""
    text = ids = None
    for index, item in enumerate(value):
        if text is None and isinstance(item, str):
            text = index
        elif ids is None and (type(item) is int or isinstance(item, list)):
            ids = index
        if text is not None and ids is not None:
            what = "a token id" if type(value[ids]) is int else "token ids"
            raise ValueError(
                f"mixes text and token ids (item {text} is text, item {ids} {what}); expected "
                "every item text, or every item token ids"
            )


# One prompt: text, or token ids; a batch: a list of either (one choice per prompt x n).
Prompt = Annotated[
    Text
    | Annotated[list[Text], Field(max_length=MAX_BATCH_PROMPTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(max_length=MAX_BATCH_PROMPTS)],
    BeforeValidator(_prompt_shape),
]


def _max_tokens(value: int | None) -> int | None:
    """NOTE: not ``ge=0``: its "greater than or equal to 0" hid that 0 is only allowed with echo
    (``routes_openai`` refuses 0 without it)."""
    if value is not None and value < 0:
        raise ValueError(f"is {value}; expected >= 1, or 0 with echo true")
    return value


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: Prompt
    # OpenAI's default; 0 only with echo
    max_tokens: Annotated[StrictInt | None, AfterValidator(_max_tokens)] = 16
    logprobs: TopLogprobs | None = None  # top-N per token (0: only the chosen token's)
    echo: StrictBool | None = False  # the prompt (and its logprobs) comes before the generated text
    best_of: StrictInt | None = Field(default=None, ge=1)  # generated per prompt; best n returned
    # Not implemented: accepted only at their neutral values (``NEUTRAL``), else a 400.
    suffix: str | None = None


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions shape: one entry per token in each list (with ``echo``, the
    prompt's tokens first, the first of them without a logprob)."""

    text_offset: list[int]  # where each token starts in the choice's text
    token_logprobs: list[float | None]  # the chosen token's logprob
    tokens: list[str]  # each token as the tokenizer decodes it alone
    top_logprobs: list[dict[str, float] | None]  # the top-N and the chosen token


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
