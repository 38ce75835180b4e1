"""The engine's ``TokenLogprob``s in OpenAI's two shapes: the legacy completions lists and chat's
``content`` entries. A token's string is the tokenizer's decoding of that id alone, special
tokens included as themselves (as vLLM; a token holding part of a UTF-8 character decodes to
U+FFFD), so the top-N entries of one position never collide on an empty string. ``-inf`` is
sent as -9999.0 (vLLM's value), since JSON has no infinity.
"""

from __future__ import annotations

from collections.abc import Sequence

from loraplex.engine.protocol import TokenLogprob
from loraplex.model.tokenizer import TextTokenizer
from loraplex.server.protocol import (
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)

MIN_LOGPROB = -9999.0


class TokenStrings:
    """Decodes single tokens, each id once per response."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.token_text(token_id)
        return text


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def completion_logprobs(
    entries: Sequence[TokenLogprob | None],
    strings: TokenStrings,
    num_top: int,
    *,
    first_token_id: int | None = None,
    text_offset: int = 0,
) -> CompletionLogprobs:
    """The legacy shape of ``entries``; a None entry (the first prompt token under ``echo``) is
    ``first_token_id`` without a logprob. ``top_logprobs`` holds the ``num_top`` most likely
    tokens and the chosen one (as vLLM); ``text_offset`` counts from ``text_offset``."""
    out = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    offset = text_offset
    for entry in entries:
        if entry is None:
            token = strings(first_token_id) if first_token_id is not None else ""
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            token = strings(entry.token_id)
            top = {strings(t): _finite(lp) for t, lp in entry.top[:num_top]}
            top.setdefault(token, _finite(entry.logprob))
            out.token_logprobs.append(_finite(entry.logprob))
            out.top_logprobs.append(top)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def _top(token: str, logprob: float) -> TopLogprob:
    return TopLogprob(token=token, logprob=_finite(logprob), bytes=list(token.encode("utf-8")))


def chat_logprobs(
    entries: Sequence[TokenLogprob], strings: TokenStrings, num_top: int
) -> list[ChatTokenLogprob]:
    """Chat's ``logprobs.content``: each token with its ``num_top`` most likely alternatives."""
    out = []
    for entry in entries:
        token = strings(entry.token_id)
        out.append(
            ChatTokenLogprob(
                token=token,
                logprob=_finite(entry.logprob),
                bytes=list(token.encode("utf-8")),
                top_logprobs=[_top(strings(t), lp) for t, lp in entry.top[:num_top]],
            )
        )
    return out
