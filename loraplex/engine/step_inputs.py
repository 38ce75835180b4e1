"""What sampling needs of a step's requests besides the logits, read from the core's live
records (``EngineCore._run`` hands both to the runner): the ids each request may not sample yet
and the token histories its penalties read; and the check, at ``add``, that a request's token
ids are in the model's vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping

from loraplex.engine.live import Live
from loraplex.errors import InvalidRequestError
from loraplex.model.sampler import RowHistory
from loraplex.sampling import SamplingParams


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """Token ids the sampler indexes must be in the model's vocabulary."""
    for name, ids in (
        ("logit_bias", [t for t, _ in params.logit_bias]),
        ("stop_token_ids", list(params.stop_token_ids)),
    ):
        if any(t >= vocab_size for t in ids):
            raise InvalidRequestError(
                f"{name} token id {max(ids)} is invalid; expected < {vocab_size} (the vocabulary)",
                name,
            )


def banned_ids(
    lives: Mapping[str, Live], params: Mapping[str, SamplingParams], eos: frozenset[int]
) -> dict[str, frozenset[int]]:
    """Stop token ids, and EOS ids unless ignore_eos, per request still short of its
    ``min_tokens`` (as vLLM)."""
    return {
        rid: frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else eos)
        for rid, p in params.items()
        if len(lives[rid].output.token_ids) < p.min_tokens
    }


def histories(
    lives: Mapping[str, Live], params: Mapping[str, SamplingParams]
) -> dict[str, RowHistory]:
    """Token histories of the requests with a penalty (the others need none)."""
    reqs = {rid: lives[rid].req for rid, p in params.items() if p.penalized}
    return {
        rid: RowHistory(req.request.prompt_token_ids, req.output_token_ids)
        for rid, req in reqs.items()
    }
