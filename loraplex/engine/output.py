"""Per-request output: incremental detokenization, stop strings and stop token ids, finish and
stop reasons (torch-free).

Text is re-decoded from all output tokens each step (byte-level BPE may need several tokens for
one character), and only text that can no longer change is emitted: a trailing replacement
character (an incomplete UTF-8 sequence) and any suffix that could still grow into a stop
string are held back until the next token decides them.

``min_tokens`` (vLLM's extension): before that many tokens neither EOS nor a stop string ends
the request, and a stop string counts only if it ends in text produced from then on (as in
vLLM, a stop string wholly inside the first tokens is kept as text). A stop token id (and its
text) or a stop string ends the request with ``stop_reason`` set to it; the matched text is cut
off unless ``include_stop_str_in_output``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from loraplex.engine.protocol import FINISH_LENGTH, FINISH_STOP, TokenDelta

if TYPE_CHECKING:
    from loraplex.sampling import SamplingParams


class Detokenizer(Protocol):
    def decode(self, token_ids: Sequence[int]) -> str: ...


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
        self._detokenizer = detokenizer
        self.token_ids: list[int] = []  # every sampled token
        self.emitted = ""  # text streamed so far
        # Length of the text before the ``min_tokens``-th token: a stop string must end past it.
        self._stop_floor = 0

    def append(self, token: int, *, at_max_model_len: bool = False) -> TokenDelta:
        """Record ``token``; the delta says what to stream and whether the request is done."""
        self.token_ids.append(token)
        if len(self.token_ids) == self.params.min_tokens > 1:
            self._stop_floor = len(self._detokenizer.decode(self.token_ids[:-1]))
        text = self._detokenizer.decode(self.token_ids)
        finish, visible, reason = self._finish(text, token, at_max_model_len)
        if finish is None:
            visible = _settled(text, self.params.stop)
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
        self, text: str, token: int, at_limit: bool
    ) -> tuple[str | None, str, str | int | None]:
        """(finish reason, final text, stop reason) as vLLM: a stop token id (its text kept only
        with ``include_stop_str_in_output``) or EOS ends first, else a stop string."""
        params = self.params
        if len(self.token_ids) >= params.min_tokens:
            if token in params.stop_token_ids:
                if params.include_stop_str_in_output:
                    return FINISH_STOP, text, token
                return FINISH_STOP, self._detokenizer.decode(self.token_ids[:-1]), token
            if token in self._eos and not params.ignore_eos:
                return FINISH_STOP, text, None
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
        floor = self._stop_floor
        found = ((text.find(s, max(0, floor - len(s) + 1)), s) for s in self.params.stop)
        return min(((i, s) for i, s in found if i >= 0), key=lambda m: m[0], default=None)


def _settled(text: str, stops: tuple[str, ...]) -> str:
    """``text`` minus what the next tokens may still change."""
    text = text.rstrip("\ufffd")
    hold = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:length]):
                hold = length
                break
    return text[: len(text) - hold]
