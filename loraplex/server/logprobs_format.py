"""The engine's ``TokenLogprob``s in OpenAI's two shapes: the legacy completions lists and chat's
``content`` entries. A token's string is the tokenizer's decoding of that id alone, special
tokens included as themselves (as vLLM; a token holding part of a UTF-8 character decodes to
U+FFFD), so the top-N entries of one position never collide on an empty string. ``-inf`` is
sent as -9999.0 (vLLM's value), since JSON has no infinity.

A legacy ``text_offset`` indexes the choice's returned ``text`` (``ChoiceOffsets``): a token's
offset is where its text starts in the decode of the choice's tokens (special tokens skipped, so
the ``<|bos|>`` before an echoed prompt or a generated ``<|end|>`` advances it by nothing), and
each byte token of a character split over several (an emoji is 4 byte tokens of a byte-level
BPE) points at that character (``TextOffsets``). Under ``echo`` the output's offsets start after
the echoed prompt text. NOTE: each token advanced the offset by the length of its decode alone
(vLLM adds its shown string, a ``<|bos|>``'s 7 characters too): each byte token of a split
character counted one U+FFFD, so every offset after an emoji was 3 past its token (attack30),
and a tokenizer whose decode of a token alone drops its leading space (SentencePiece's) drifted
the other way by a character a word. OpenAI's legacy API defines the offsets as positions in the
text.
"""

from __future__ import annotations

from collections.abc import Sequence

from loraplex.engine.output import Detokenizer, IncrementalText
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
        self._bytes: dict[int, list[int]] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.token_text(token_id)
        return text

    def bytes_of(self, token_id: int) -> list[int]:
        """The token's bytes for chat's ``bytes`` (``TextTokenizer.token_bytes``: a byte token
        its own byte, not the U+FFFD its string shows); a tokenizer without it, the string's."""
        found = self._bytes.get(token_id)
        if found is None:
            token_bytes = getattr(self._tokenizer, "token_bytes", None)
            raw = token_bytes(token_id) if token_bytes else self(token_id).encode("utf-8")
            found = self._bytes[token_id] = list(raw)
        return found

    @property
    def decoder(self) -> Detokenizer:
        """What decodes a choice's tokens for their offsets: the tokenizer's decode, without
        the clean-up of spaces where it has one (that rewrites text already decoded, so its
        offsets drift by the spaces it removes: docs/benchmarks/attack28.md)."""
        if getattr(self._tokenizer, "rewrites_text", False) and hasattr(self._tokenizer, "raw"):
            return self._tokenizer.raw
        return self._tokenizer


class TextOffsets:
    """Where each of a run of tokens starts in the decode of the run, plus ``start``, kept
    incrementally (``IncrementalText``: a cost per token that does not grow with the run).

    A token that adds text starts where the text before it ends; one that completes a
    character split over byte tokens starts where that character does (the decode after it
    rewrote the U+FFFD it ended with); a byte token inside a character still incomplete (the
    decode unchanged, ending in a U+FFFD not yet final) starts at that U+FFFD. A U+FFFD that the
    next token leaves as it is (a byte no later byte completes) is final text: the next token
    starts after it."""

    def __init__(self, decoder: Detokenizer, start: int = 0) -> None:
        self._text = IncrementalText(decoder)
        self._start = start

    def next(self, token_id: int | None) -> int:
        """The offset of ``token_id``, then counted as decoded; None: where the next token
        that adds text would start."""
        text = self._text
        before, final = text.text, text.final_chars  # the text before ``final`` stays
        if token_id is None:
            return self._start + len(before)
        after = text.append(token_id)
        if after[final : len(before)] == before[final:]:  # nothing decoded before it changed
            inside = len(after) == len(before) > final and before.endswith("\ufffd")
            return self._start + len(before) - inside
        common = final
        while common < len(before) and common < len(after) and after[common] == before[common]:
            common += 1
        return self._start + common


class ChoiceOffsets:
    """One completions choice's ``text_offset``: under ``echo`` its prompt's tokens in the
    echoed prompt, then its output's tokens after the echoed text (``echo_chars``)."""

    def __init__(self, strings: TokenStrings, echo_chars: int | None = None) -> None:
        self._prompt = TextOffsets(strings.decoder)
        self._output = TextOffsets(strings.decoder, echo_chars or 0)

    def prompt(self, token_id: int | None) -> int:
        return self._prompt.next(token_id)

    def output(self, token_id: int) -> int:
        return self._output.next(token_id)


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def completion_logprobs(
    entries: Sequence[TokenLogprob | None],
    strings: TokenStrings,
    num_top: int,
    offsets: ChoiceOffsets,
    *,
    num_prompt: int = 0,
    first_token_id: int | None = None,
) -> CompletionLogprobs:
    """The legacy shape of ``entries``, the first ``num_prompt`` of them the echoed prompt's; a
    None entry (the first prompt token under ``echo``) is ``first_token_id`` without a logprob.
    ``top_logprobs`` holds the ``num_top`` most likely tokens and the chosen one (as vLLM);
    ``offsets`` go on from the choice's earlier entries (the module docstring)."""
    out = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    for i, entry in enumerate(entries):
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
        if i < num_prompt or token_id is None:
            out.text_offset.append(offsets.prompt(token_id))
        else:
            out.text_offset.append(offsets.output(token_id))
    return out


def _top(strings: TokenStrings, token_id: int, logprob: float) -> TopLogprob:
    return TopLogprob(
        token=strings(token_id), logprob=_finite(logprob), bytes=strings.bytes_of(token_id)
    )


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
                bytes=strings.bytes_of(entry.token_id),
                top_logprobs=[_top(strings, t, lp) for t, lp in entry.top[:num_top]],
            )
        )
    return out
