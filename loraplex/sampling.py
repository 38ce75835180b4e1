"""``SamplingParams``: how one request picks tokens and when it stops.

Torch-free, so the HTTP process builds engine requests without importing torch; the sampler
(``model/sampler.py``) reads it inside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

# Below this temperature a request is greedy (as vLLM): dividing logits by a tinier one
# overflows float32 to inf and turns the row's probabilities into NaN.
MIN_TEMPERATURE = 1e-5
# torch.Generator.manual_seed takes a signed 64-bit seed (vLLM's range too).
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens and when it stops."""

    max_tokens: int = 16  # tokens to generate at most
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
    repetition_penalty: float = 1.0  # > 0: positive logits divided by it, negative multiplied
    min_p: float = 0.0  # [0, 1]: drop tokens below min_p x the most likely token's probability
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) added
    stop_token_ids: tuple[int, ...] = ()  # generation ends after sampling one of these
    include_stop_str_in_output: bool = False  # keep the matched stop string in the text
    logprobs: int | None = None  # per output token: its logprob and this many top ones; None: off
    prompt_logprobs: int | None = None  # per prompt token likewise (echo); None: off

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens {self.max_tokens} is invalid; expected >= 1")
        if not self.temperature >= 0:
            raise ValueError(f"temperature {self.temperature} is invalid; expected >= 0")
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

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE
