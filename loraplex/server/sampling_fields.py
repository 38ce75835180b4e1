"""From an OpenAI request's sampling fields to the engine's ``SamplingParams``: what is
translated, and what is refused with a 400 naming the field rather than silently ignored."""

from __future__ import annotations

from loraplex.errors import clipped
from loraplex.sampling import SamplingParams
from loraplex.server.errors import invalid_request
from loraplex.server.protocol import NEUTRAL, SamplingFields


def _refuse_unsupported(body: SamplingFields) -> None:
    """A 400 for fields set to values loraplex cannot honour (rather than silently ignoring)."""
    if body.n != 1:
        raise invalid_request(f"n {body.n} is not supported; expected 1", "n")
    for field, neutral in NEUTRAL.items():
        value = getattr(body, field, None)
        if value is not None and not any(_same(value, n) for n in neutral):
            raise invalid_request(
                f"{field} {clipped(repr(value))} is not supported; loraplex refuses what it "
                f"does not implement (accepted: null or {', '.join(map(repr, neutral))})",
                field,
            )
    if body.stream_options is not None and not body.stream:
        raise invalid_request("stream_options is only allowed with stream true", "stream_options")


def _same(value: object, neutral: object) -> bool:
    """Equal and of the same kind (``True == 1`` must not pass for ``best_of``)."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


def sampling_params(body: SamplingFields, max_tokens: int | None) -> SamplingParams:
    _refuse_unsupported(body)
    try:
        return SamplingParams(
            max_tokens=max_tokens or 16,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop_strings(),
            ignore_eos=body.ignore_eos,
            min_tokens=body.min_tokens,
            top_k=body.top_k if body.top_k is not None and body.top_k > 0 else None,
        )
    except ValueError as exc:  # each message starts with the field it is about
        field = str(exc).split(" ", 1)[0]
        raise invalid_request(str(exc), field if field in _SAMPLING_FIELDS else None) from exc


_SAMPLING_FIELDS = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "min_tokens"}
)
