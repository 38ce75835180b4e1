"""The engine's ``TokenLogprob``s in OpenAI's two shapes: the legacy completions lists and chat's
``content`` entries. A token's string is the tokenizer's decoding of that id alone, special
tokens included as themselves (as vLLM; a token holding part of a UTF-8 character decodes to
U+FFFD), so the top-N entries of one position never collide on an empty string. ``-inf`` is
sent as -9999.0 (vLLM's value), since JSON has no infinity.

A legacy ``text_offset`` indexes the choice's returned ``text``: each token advances it by the
length of what the text holds of that token, its decoding with special tokens skipped, so a
special token (the ``<|bos|>`` the tokenizer puts before an echoed prompt, an ``<|end|>`` the
model generated) advances it by nothing. NOTE: it advanced by the token's shown string, as
vLLM's does, so under ``echo`` every offset counted a ``<|bos|>`` the returned text does not
hold (7 characters past the true start on the demo model), and ``text[text_offset[i]:]`` did
not start with ``tokens[i]``; OpenAI's legacy API defines the offsets as positions in the text.
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

        self._lengths: dict[int, int] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.token_text(token_id)
        return text

    def length_in_text(self, token_id: int) -> int:
        """How many characters of a returned text the token is: 0 for a special token, which
        decoding skips (the module docstring)."""
        length = self._lengths.get(token_id)
        if length is None:
            length = self._lengths[token_id] = len(self._tokenizer.decode([token_id]))
        return length


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def completion_logprobs(
    entries: Sequence[TokenLogprob | None],
    strings: TokenStrings,
    num_top: int,
    *,
    first_token_id: int | None = None,
    text_offset: int = 0,
) -> tuple[CompletionLogprobs, int]:
    """The legacy shape of ``entries`` and the text offset after them; a None entry (the first
    prompt token under ``echo``) is ``first_token_id`` without a logprob. ``top_logprobs`` holds
    the ``num_top`` most likely tokens and the chosen one (as vLLM); ``text_offset`` counts from
    ``text_offset`` in the returned text (the module docstring)."""
    out = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    offset = text_offset
    for entry in entries:
        token_id = first_token_id if entry is None else entry.token_id
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
        offset += 0 if token_id is None else strings.length_in_text(token_id)
    return out, offset


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
