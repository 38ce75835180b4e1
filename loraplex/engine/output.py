"""Per-request output: incremental detokenization, stop strings and stop token ids, finish and
stop reasons (torch-free).

The text is the decode of all output tokens, kept incrementally (``IncrementalText``, as
vLLM's ``detokenize_incrementally``): each step decodes only the tokens since the last complete
character plus a few before them, not the whole output. Only text that can no longer change is
emitted: a trailing replacement character (an incomplete UTF-8 sequence) and any suffix that could
still grow into a stop string are held back until the next token decides them.

``min_tokens`` (vLLM's extension): before that many tokens neither EOS nor a stop string ends
the request, and a stop string counts only if it ends in text produced from then on (as in
vLLM, a stop string wholly inside the first tokens is kept as text). A stop token id (and its
text) or a stop string ends the request with ``stop_reason`` set to it; the matched text is cut
off unless ``include_stop_str_in_output``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from loraplex.engine.protocol import FINISH_LENGTH, FINISH_STOP, TokenDelta
from loraplex.engine.stop_scan import StopScan

if TYPE_CHECKING:
    from loraplex.sampling import SamplingParams


class Detokenizer(Protocol):
    """Decodes token ids to text (an optional ``rewrites_text`` attribute, true when decoding
    more tokens can change text already decoded, makes ``IncrementalText`` decode whole)."""

    def decode(self, token_ids: Sequence[int]) -> str: ...


# A run of tokens whose text keeps ending in a replacement character is committed once it is
# this long (``IncrementalText``): its window then stays a few dozen tokens, whatever the run.
MAX_PENDING_TOKENS = 16
# Tokens a forced commit leaves undecided at the end, and the context it keeps before its
# point: a UTF-8 character has at most 4 bytes, so 4 byte tokens after a point decide any
# character cut there, and 4 before it hold any lead byte of one.
HOLD_TOKENS = 4


class IncrementalText:
    """The decode of a growing token list, equal to ``decode(token_ids)`` after every
    ``append`` at a cost per token that does not grow with the output.

    ``_read`` is the first token whose text is not yet committed (``_done`` is the decode of the
    tokens before it, ending in a complete character or a committed run, below); ``_prefix`` is
    where the decode window starts, a little before ``_read``, so a tokenizer whose decode of a
    token depends on the one before it (a dropped leading space) sees that context; the window's
    text past the text of ``tokens[_prefix:_read]`` is the new text. The offsets move on when the
    window's text does not end in a replacement character (bytes of a character still to come).
    A window whose text does not extend its context's text (the tokenizer rewrote it) falls back
    to a whole decode for that step. A detokenizer with ``rewrites_text`` true (transformers'
    clean-up of spaces before punctuation, which can change text already committed) is always
    decoded whole.

    A run of tokens that never completes a character (an adapter emitting lone UTF-8
    continuation bytes) kept the window growing, each step decoding the whole run: quadratic in
    the run. Past ``MAX_PENDING_TOKENS`` pending tokens the text is committed up to
    ``HOLD_TOKENS`` before the end (or up to 3 tokens earlier, where a character the held
    tokens complete starts), as it decodes there, its replacement characters final: a character
    is complete within 4 byte tokens or it is a replacement, as ``decode`` with
    ``errors='replace'`` renders it. Byte tokens still decode exactly as a whole decode; only
    tokens that decode to no bytes at all (special tokens, skipped) between the bytes of one
    character can make replacements of a character a whole decode would complete.

    NOTE: the whole output used to be decoded on every token: 70-108 µs per token per sequence at
    480 tokens on the engine thread (attack12, ``scripts/attacks/stop-hold-bench``)."""

    def __init__(self, detokenizer: Detokenizer) -> None:
        self._detokenizer = detokenizer
        self._whole = bool(getattr(detokenizer, "rewrites_text", False))
        self.token_ids: list[int] = []
        self.text = ""  # decode(token_ids)
        self._done = ""  # decode(token_ids[: self._read])
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""  # decode(token_ids[self._prefix : self._read])

    @property
    def final_chars(self) -> int:
        """Characters at the start of ``text`` that no later token changes: the committed text
        (a committed run's replacement characters included)."""
        return len(self._done)

    def append(self, token: int) -> str:
        ids = self.token_ids
        ids.append(token)
        decode = self._detokenizer.decode
        if self._whole:
            self.text = decode(ids)
            return self.text
        window = decode(ids[self._prefix :])
        if window.startswith(self._prefix_text):
            self.text = self._done + window[len(self._prefix_text) :]
            context = self._read
        else:  # the tokenizer rewrote the context: decode it all, then go on without context
            self.text = decode(ids)
            context = len(ids)
        if not self.text.endswith("\ufffd"):
            self._done = self.text
            self._prefix, self._read = context, len(ids)
            self._prefix_text = decode(ids[context:])
        elif len(ids) - self._read > MAX_PENDING_TOKENS:
            self._commit_pending(window)
        return self.text

    def _commit_pending(self, window: str) -> None:
        """Commits a run of pending tokens (the class docstring): at the latest of 4 points
        before the held tokens whose text the window's extends, with ``HOLD_TOKENS`` of context;
        where none does (tokens without bytes, or a rewritten context), everything as it
        decodes now, without context."""
        ids, decode = self.token_ids, self._detokenizer.decode
        end = len(ids) - HOLD_TOKENS
        if window.startswith(self._prefix_text):
            for point in range(end, end - HOLD_TOKENS, -1):
                head = decode(ids[self._prefix : point])
                if head.startswith(self._prefix_text) and window.startswith(head):
                    self._done += head[len(self._prefix_text) :]
                    self._prefix, self._read = point - HOLD_TOKENS, point
                    self._prefix_text = decode(ids[self._prefix : point])
                    return
        self._done = self.text
        self._prefix = self._read = len(ids)
        self._prefix_text = ""


class CleanedText:
    """``decode(token_ids)`` of a tokenizer whose decode cleans up the text (transformers'
    ``clean_up_tokenization_spaces``: a space before punctuation or a contraction removed),
    kept incrementally, with ``final_chars`` the characters no later token changes.

    The clean-up rewrites text already decoded (``a `` then ``,`` reads ``a,``), so the
    decoded text is no prefix of the next token's. The detokenizer's raw decode (``raw``: no
    clean-up) is kept by an ``IncrementalText``; the clean-up (``clean_up``) is applied in
    pieces, cut where ``clean_up_cut`` allows (between two characters no clean-up rewrite can
    span, whatever comes later: ``model/tokenizer.py``), so the text before the last cut is
    final and each token cleans only what follows it.

    NOTE: ``OutputTracker`` decoded such a tokenizer's whole output on every token and
    streamed the text as if it only grew: after a rewrite of text already sent, the rest of
    the answer (and of its non-streamed text, made of the same deltas) was lost in silence
    (docs/benchmarks/attack28.md). A run without a cut (``" , , , ,"``) is cleaned whole each
    token and held back until a cut or the end."""

    def __init__(self, detokenizer: Any) -> None:
        self._raw = IncrementalText(detokenizer.raw)
        self._clean_up = detokenizer.clean_up
        self._may_cut = detokenizer.clean_up_cut
        self.token_ids = self._raw.token_ids
        self.text = ""  # clean_up(decode(token_ids))
        self._cut = 0  # raw characters before the last cut
        self._scanned = 1  # the next raw position to test as a cut
        self._done = ""  # clean_up of the raw text before the last cut: final

    @property
    def final_chars(self) -> int:
        """Characters at the start of ``text`` that no later token changes."""
        return len(self._done)

    def append(self, token: int) -> str:
        raw = self._raw.append(token)
        final = self._raw.final_chars  # raw characters no later token changes
        cut = self._cut
        for i in range(self._scanned, final):  # a cut before raw[i]: both sides final
            if self._may_cut(raw[i - 1], raw[i]):
                cut = i
        self._scanned = max(self._scanned, final)
        if cut > self._cut:
            self._done += self._clean_up(raw[self._cut : cut])
            self._cut = cut
        self.text = self._done + self._clean_up(raw[self._cut :])
        return self.text


class OutputTracker:
    """Turns one request's sampled tokens into TokenDeltas."""

    def __init__(
        self,
        params: SamplingParams,
        prompt_tokens: int,
        eos_token_ids: frozenset[int],
        detokenizer: Detokenizer,
    ) -> None:
        self.params = params
        self.prompt_tokens = prompt_tokens
        self._eos = eos_token_ids
        # A tokenizer whose decode cleans up (``CleanedText``) streams only its final text.
        self._cleaned = bool(getattr(detokenizer, "rewrites_text", False)) and hasattr(
            detokenizer, "raw"
        )
        self._text: IncrementalText | CleanedText = (
            CleanedText(detokenizer) if self._cleaned else IncrementalText(detokenizer)
        )
        self.token_ids = self._text.token_ids  # every sampled token
        self.emitted = ""  # text streamed so far
        # Length of the text before the ``min_tokens``-th token: a stop string must end past it.
        self._stop_floor = 0
        self._hold = StopHold(params.stop)
        self._scan = StopScan(params.stop)

    def append(self, token: int, *, at_max_model_len: bool = False) -> TokenDelta:
        """Record ``token``; the delta says what to stream and whether the request is done."""
        before = self._text.text  # decode(token_ids) before this token
        text = self._text.append(token)
        if len(self.token_ids) == self.params.min_tokens > 1:
            self._stop_floor = len(before)
        finish, visible, reason = self._finish(text, before, token, at_max_model_len)
        if finish is None:
            final = self._text.final_chars
            visible = self._hold.settled(text[:final] if self._cleaned else text, final)
        delta = visible[len(self.emitted) :] if visible.startswith(self.emitted) else ""
        self.emitted += delta
        return TokenDelta(
            token_ids=(token,),
            text=delta,
            finish_reason=finish,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=len(self.token_ids),
            stop_reason=reason,
        )

    def _finish(
        self, text: str, before: str, token: int, at_limit: bool
    ) -> tuple[str | None, str, str | int | None]:
        """(finish reason, final text, stop reason) as vLLM's ``check_stop``: EOS (stop reason
        None, even when ``stop_token_ids`` lists it) or a stop token id (its text kept only with
        ``include_stop_str_in_output``) ends first, else a stop string. NOTE: the stop token ids
        were tested first, so EOS listed in them answered ``stop_reason`` 2 where vLLM answers
        null (docs/benchmarks/vllmdiff.md)."""
        params = self.params
        if len(self.token_ids) >= params.min_tokens:
            if token in self._eos and not params.ignore_eos:
                return FINISH_STOP, text, None
            if token in params.stop_token_ids:
                if params.include_stop_str_in_output:
                    return FINISH_STOP, text, token
                return FINISH_STOP, before, token
            match = self._stop_match(text)
            if match is not None:
                start, stop = match
                end = start + len(stop) if params.include_stop_str_in_output else start
                return FINISH_STOP, text[:end], stop
        if len(self.token_ids) >= params.max_tokens or at_limit:
            return FINISH_LENGTH, text, None
        return None, text, None

    def _stop_match(self, text: str) -> tuple[int, str] | None:
        """The earliest stop string that ends past the ``min_tokens`` floor, and where it
        starts (the first listed wins a tie)."""
        return self._scan.match(text, self._stop_floor)


class StopHold:
    """What of the text can no longer change: the text minus trailing replacement characters
    (those a later token may still complete) and minus the longest proper prefix of a stop
    string it ends with (the next tokens may complete it).

    Each stop string is matched as a Knuth-Morris-Pratt automaton fed only the characters added
    since the last call, so a token costs work per new character, not per character of the stop
    strings. NOTE: each token used to try every prefix of every stop string (``text.endswith(
    stop[:n])`` for n from 1,023 down): 4 stop strings of 1,024 characters, which never match,
    cost about 4,000 slices and comparisons per token of every sequence, on the engine thread
    that steps every tenant. Text that does not extend the last one (a tokenizer may rewrite
    earlier text) restarts the automata on its last characters only (a match is shorter than its
    stop string)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._borders = [_borders(stop) for stop in stops]  # once per request: O(stop length)
        self._matched = [0] * len(stops)  # per stop: the prefix of it the text ends with
        self._seen = ""  # the settled text the automata have read

    def settled(self, text: str, final_chars: int = 0) -> str:
        """``text`` without what may still change; ``final_chars``: characters at its start
        that cannot (``IncrementalText.final_chars``: replacement characters there stay)."""
        tail = text[final_chars:]
        kept = len(tail.rstrip("\ufffd"))
        if kept < len(tail):
            text = text[: final_chars + kept]
        if not self._stops:
            return text
        if text.startswith(self._seen):
            new, restart = text[len(self._seen) :], False
        else:
            new, restart = text, True
        for i, stop in enumerate(self._stops):
            fed = new if not restart else new[max(0, len(new) - len(stop) + 1) :]
            self._matched[i] = _feed(
                stop, self._borders[i], 0 if restart else self._matched[i], fed
            )
        self._seen = text
        return text[: len(text) - max(self._matched)]


def _borders(stop: str) -> list[int]:
    """The KMP failure function: entry i is the longest proper prefix of ``stop`` that is also a
    suffix of ``stop[: i + 1]``."""
    borders = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = borders[k - 1]
        if stop[i] == stop[k]:
            k += 1
        borders[i] = k
    return borders


def _feed(stop: str, borders: list[int], matched: int, chars: str) -> int:
    """The longest proper prefix of ``stop`` that the text ends with, after ``chars`` are added
    to a text ending with ``matched`` characters of it (amortised O(1) per character)."""
    for char in chars:
        while matched and char != stop[matched]:
            matched = borders[matched - 1]
        if char == stop[matched]:
            matched += 1
        if matched == len(stop):  # a whole stop string (one before min_tokens is text)
            matched = borders[matched - 1]
    return matched
