"""From an OpenAI request's sampling fields to the engine's ``SamplingParams``: what is
translated, and what is refused with a 400 naming the field rather than silently ignored.

``check_sampling`` runs before the prompt is tokenized or anything reaches the engine; the
parameters themselves are built once per prompt after it is encoded, with the output budget
``fit_max_tokens`` decides from the prompt's length (max_tokens is decided in one place).
"""

from __future__ import annotations

from collections.abc import Callable

from loraplex import sampling
from loraplex.errors import ContextLengthError, clipped
from loraplex.sampling import MAX_BIAS, SamplingParams
from loraplex.server.errors import context_error, invalid_request
from loraplex.server.protocol import (
    NEUTRAL,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    same_value,
    unsupported,
)

# Digits of a logit_bias key at most: any vocabulary's ids fit, and ``int()`` of a longer key
# costs time (Python refuses past 4,300 digits, in its own words).
MAX_TOKEN_ID_DIGITS = 10
# SamplingParams' field (the first word of its ValueError) -> the request field to name.
_SAMPLING_FIELDS = {
    name: name
    for name in [
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "min_tokens",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
        "logit_bias",
        "stop_token_ids",
        "logprobs",
    ]
} | {"prompt_logprobs": "logprobs"}


def _refuse_unsupported(body: SamplingFields) -> None:
    """A 400 for fields set to values loraplex cannot honour (rather than silently ignoring)."""
    for field, neutral in NEUTRAL.items():
        value = getattr(body, field, None)
        if value is not None and not any(same_value(value, n) for n in neutral):
            raise invalid_request(f"{field} {unsupported(field, value)}", field)
    options = body.stream_options
    if options is not None and not body.stream:
        raise invalid_request("stream_options is only allowed with stream true", "stream_options")


def _token_id(value: int, vocab_size: int | None, field: str) -> int:
    if value < 0 or (vocab_size is not None and value >= vocab_size):
        bound = "..." if vocab_size is None else str(vocab_size)
        raise invalid_request(
            f"{field} token id {value} is invalid; expected one in [0, {bound})", field
        )
    return value


def _logit_bias(
    bias: dict[str, float] | None, vocab_size: int | None
) -> tuple[tuple[int, float], ...]:
    """Entries sorted by token id (the count is bounded by the schema)."""
    if not bias:
        return ()
    entries = []
    for key, value in bias.items():
        if not (len(key) <= MAX_TOKEN_ID_DIGITS and key.isascii() and key.isdigit()):
            raise invalid_request(
                f"logit_bias key {clipped(repr(key))} is invalid; expected a token id (at most "
                f"{MAX_TOKEN_ID_DIGITS} digits)",
                "logit_bias",
            )
        if not -MAX_BIAS <= value <= MAX_BIAS:
            raise invalid_request(
                f"logit_bias value {value} is invalid; expected [-100, 100]", "logit_bias"
            )
        entries.append((_token_id(int(key), vocab_size, "logit_bias"), value))
    return tuple(sorted(entries))


def output_logprobs(body: SamplingFields) -> int | None:
    """How many alternatives per output token the client asked for (0: only the chosen
    token's logprob); None: no logprobs."""
    if isinstance(body, CompletionRequest):
        return body.logprobs
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise invalid_request("top_logprobs needs logprobs true", "top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else None
    return None


def sampling_params(
    body: SamplingFields, max_tokens: int, vocab_size: int | None, *, rank_choices: bool = False
) -> SamplingParams:
    """The engine's parameters for ``body`` (400 naming the field for any invalid value).
    ``rank_choices``: best_of needs every token's logprob even when the client did not ask."""
    _refuse_unsupported(body)
    logprobs = output_logprobs(body)
    if rank_choices and logprobs is None:
        logprobs = 0
    echo = isinstance(body, CompletionRequest) and bool(body.echo)
    stop_ids = tuple(_token_id(t, vocab_size, "stop_token_ids") for t in body.stop_token_ids or ())
    return _checked(
        lambda: SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop_strings(),
            ignore_eos=body.ignore_eos,
            min_tokens=body.min_tokens,
            top_k=body.top_k if body.top_k is not None and body.top_k > 0 else None,
            presence_penalty=_or(body.presence_penalty, 0.0),
            frequency_penalty=_or(body.frequency_penalty, 0.0),
            repetition_penalty=_or(body.repetition_penalty, 1.0),
            min_p=_or(body.min_p, 0.0),
            logit_bias=_logit_bias(body.logit_bias, vocab_size),
            stop_token_ids=stop_ids,
            include_stop_str_in_output=bool(body.include_stop_str_in_output),
            logprobs=logprobs,
            prompt_logprobs=logprobs if echo and output_logprobs(body) is not None else None,
        )
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _checked(build: Callable[[], SamplingParams]) -> SamplingParams:
    try:
        params = build()
    except ValueError as exc:  # each message starts with the field it is about
        field = str(exc).split(" ", 1)[0]
        raise invalid_request(str(exc), _SAMPLING_FIELDS.get(field)) from exc
    return params


def check_sampling(
    body: SamplingFields, requested: int | None, vocab_size: int | None, *, rank_choices: bool
) -> None:
    """Every sampling field of ``body`` valid (400 naming the first that is not), before the
    prompt costs an encode. The output budget is not known yet: it is checked here at the
    smallest value the request allows (``requested``, else enough for ``min_tokens``), and
    decided per prompt by ``fit_max_tokens``."""
    smallest = requested or max(1, body.min_tokens)
    sampling_params(body, smallest, vocab_size, rank_choices=rank_choices)


def fit_max_tokens(
    requested: int | None, num_prompt_tokens: int, max_model_len: int | None, param: str
) -> int:
    """``sampling.fit_max_tokens`` (the rule the simulator applies too), its refusal the 400
    naming ``param``."""
    try:
        return sampling.fit_max_tokens(requested, num_prompt_tokens, max_model_len, param)
    except ContextLengthError as exc:
        raise context_error(exc) from None
