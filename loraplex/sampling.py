"""``SamplingParams``: how one request picks tokens and when it stops; and how many it may ask
for in a context of ``max_model_len`` (``check_prompt_room``, ``fit_max_tokens``: the server's
rules before it queues a request, which the simulator applies to a trace's records).

Torch-free, so the HTTP process builds engine requests without importing torch; the sampler
(``model/sampler.py``) reads it inside the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loraplex.errors import ContextLengthError

# Below this temperature a request is greedy: dividing logits by a tinier one overflows float32
# to inf and turns the row's probabilities into NaN. (vLLM 0.32.0 raises one in (0, 0.01) to
# 0.01 and samples: docs/operations.md, *Failure isolation*.)
MIN_TEMPERATURE = 1e-5
# torch.Generator.manual_seed takes a signed 64-bit seed (vLLM's range too).
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20  # top-N alternatives per token at most (vLLM's default max_logprobs)
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's cap on logit_bias
MAX_BIAS = 100.0  # |bias| per token at most (OpenAI's range)
MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty| at most (OpenAI's range)
MAX_STOP_TOKEN_IDS = 64
# The repetition penalty divides positive logits and multiplies negative ones. vLLM only asks
# for > 0, but 1e-300 is 0 in float32, and x / 0 turns every logit inf or NaN; within these
# bounds a float32 logit moves by 100x at most (bias, penalties and temperature >= 1e-5 keep
# realistic logits far below float32's 3.4e38 too).
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0


# Finish reasons a generation ends with (OpenAI's vocabulary plus "abort").
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"

# Output tokens of a request that names no max_tokens where its context length is not known
# (OpenAI's completions default; ``loraplex serve`` always knows the context, and there the
# default is the rest of it).
DEFAULT_MAX_TOKENS = 16


def check_prompt_room(
    num_prompt_tokens: int, max_model_len: int, which: str = "the prompt", param: str = "prompt"
) -> None:
    """A prompt of ``max_model_len`` tokens or more leaves no room for a token after it: a
    ``ContextLengthError`` naming ``param`` (chat's: ``messages``; ``which``: how the message
    names it, e.g. "prompt 2" in a batch). The server refuses it before it is queued
    (``server/prompts.py``, ``server/prompt_bounds.py``), and so does the simulator
    (``sim/refusal.py``)."""
    if num_prompt_tokens >= max_model_len:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens; {which} has "
            f"{num_prompt_tokens} token ids (at most {max_model_len - 1}, so that one token can "
            "follow); reduce the prompt",
            param,
        )


def fit_max_tokens(
    requested: int | None, num_prompt_tokens: int, max_model_len: int | None, param: str
) -> int:
    """The output budget of one prompt: ``requested``; when None, the rest of the context, or
    ``DEFAULT_MAX_TOKENS`` (16) where the context length is not known (a server built without
    one; ``loraplex serve`` always passes it). A prompt plus an explicit ``requested`` beyond
    the context is a ``ContextLengthError`` naming ``param`` (vLLM's rule) rather than a
    silently shorter output; the server (``server/submit.py``) and the simulator both apply it."""
    if max_model_len is None:
        return requested if requested is not None else DEFAULT_MAX_TOKENS
    remaining = max_model_len - num_prompt_tokens
    if requested is None:
        return max(1, remaining)  # a prompt filling the context is refused by its own check
    if requested > remaining:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens; the request asks "
            f"for {num_prompt_tokens + requested} ({num_prompt_tokens} in the prompt, "
            f"{requested} in {param}); reduce the prompt or {param}",
            param,
        )
    return requested


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens and when it stops."""

    max_tokens: int = DEFAULT_MAX_TOKENS  # tokens to generate at most
    temperature: float = 0.0  # 0 = greedy (argmax); otherwise logits are divided by it
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p
    top_k: int | None = None  # keep the k most likely tokens; None = no limit
    seed: int | None = None  # seeds this request's generator; None = fresh entropy
    stop: tuple[str, ...] = ()  # generation ends when the text contains one (it is cut off)
    ignore_eos: bool = False  # keep generating past end-of-sequence tokens
    min_tokens: int = 0  # neither EOS nor a stop string ends generation before this many tokens
    # vLLM's definitions (issue 15). Penalties: presence/frequency over output tokens,
    # repetition over prompt and output tokens (> 1 discourages, < 1 encourages).
    presence_penalty: float = 0.0  # [-2, 2]: subtracted once from a token already generated
    frequency_penalty: float = 0.0  # [-2, 2]: subtracted per time a token was generated
    repetition_penalty: float = 1.0  # [0.01, 100]: positive logits divided by it, negative x it
    min_p: float = 0.0  # [0, 1]: drop tokens below min_p x the most likely token's probability
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) added
    stop_token_ids: tuple[int, ...] = ()  # generation ends after sampling one of these
    include_stop_str_in_output: bool = False  # keep the matched stop string in the text
    logprobs: int | None = None  # per output token: its logprob and this many top ones; None: off
    prompt_logprobs: int | None = None  # per prompt token likewise (echo); None: off

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens {self.max_tokens} is invalid; expected >= 1")
        # NOTE: an infinite temperature turns the -inf of a banned token into NaN.
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature {self.temperature} is invalid; expected finite, >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p} is invalid; expected 0 < top_p <= 1")
        if self.seed is not None and not MIN_SEED <= self.seed <= MAX_SEED:
            raise ValueError(
                f"seed {self.seed} is invalid; expected a signed 64-bit integer "
                f"[{MIN_SEED}, {MAX_SEED}]"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k {self.top_k} is invalid; expected >= 1 or None")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens {self.min_tokens} is invalid; expected 0 <= min_tokens <= "
                f"max_tokens ({self.max_tokens})"
            )
        if any(not s for s in self.stop):
            raise ValueError(f"stop {self.stop!r} is invalid; expected non-empty strings")
        self._check_processing()
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(
                    f"{name} {value} is invalid; expected 0 <= {name} <= {MAX_LOGPROBS} or None"
                )

    def _check_processing(self) -> None:
        """The logit processors' fields (issue 15), in OpenAI's / vLLM's ranges."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name} {value} is invalid; expected -2 <= {name} <= 2")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(
                f"repetition_penalty {self.repetition_penalty} is invalid; expected "
                f"{MIN_REPETITION_PENALTY:g} <= repetition_penalty <= {MAX_REPETITION_PENALTY:g}"
            )
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p {self.min_p} is invalid; expected 0 <= min_p <= 1")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(
                f"logit_bias has {len(self.logit_bias)} entries; expected at most "
                f"{MAX_LOGIT_BIAS_ENTRIES}"
            )
        for token, bias in self.logit_bias:
            if token < 0 or not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(
                    f"logit_bias entry ({token}, {bias}) is invalid; expected a token id >= 0 "
                    f"and a bias in [-{MAX_BIAS:g}, {MAX_BIAS:g}]"
                )
        if len({token for token, _ in self.logit_bias}) != len(self.logit_bias):
            raise ValueError("logit_bias is invalid; expected each token id at most once")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS or any(t < 0 for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids {self.stop_token_ids!r} is invalid; expected at most "
                f"{MAX_STOP_TOKEN_IDS} token ids >= 0"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def penalized(self) -> bool:
        """Whether a penalty reads the token history (the sampler then needs it)."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def processes_logits(self) -> bool:
        """Whether any logit processor applies; when no row's does, the sampler's fast path
        (one argmax for a greedy batch) runs and these features cost nothing."""
        return self.penalized or bool(self.logit_bias) or (self.min_p > 0 and not self.greedy)


@dataclass(frozen=True)
class TokenLogprob:
    """One position's logprobs, from the raw (unprocessed) float32 logits of the forward that
    sampled it, as vLLM's default ``raw_logprobs``."""

    token_id: int  # the token at this position (sampled, or the prompt's)
    logprob: float  # its log-probability
    rank: int  # its rank among the vocabulary (1 = most likely)
    top: tuple[tuple[int, float], ...]  # the most likely (token id, logprob), best first
