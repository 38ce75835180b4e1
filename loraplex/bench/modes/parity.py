"""When ``bench modes`` accepts a merged greedy continuation that differs from the unmerged one.

float32: never. Merged and unmerged are the same arithmetic up to float32 rounding, and every
probe and replayed request is token-for-token identical; any differing token fails the bench.

bfloat16 / float16: merging rounds ``W + s B A`` to the model dtype once per weight, where
unmerged adds ``s B A x`` to ``W x`` at run time, so the two differ by about one rounding step
per weight. Where two tokens are nearly tied, that can flip a greedy argmax, and from there the
two continuations run on different contexts. The rule (:func:`first_divergence`): at the first
differing position, each side's token must be among the other side's ``top_k`` logprobs, and
the unmerged side's gap, ``logprob(its token) - logprob(the merged side's token)``, must be
below ``max_gap_nats``; later positions are not compared. Anything else is a wrong answer.

``max_gap_nats`` comes from a measurement (docs/modes.md, "Parity rule"): on the bench's
random models in bfloat16 (small and large presets), the unmerged path's logprobs of the float32
reference's top-5 tokens were at most ``BF16_UNMERGED_ERROR_NATS`` off the float32 ones
(teacher-forced over every probe; the larger of the two presets' figures). The test of
``tests/model/test_merge.py`` lets merged logits be off by twice the unmerged error, so a flip
between merged and unmerged needs a gap of at most about ``(1 + 2) * 2 * error`` (each of the
two tokens' logprobs moves by up to three errors, in opposite directions):
``max_gap_nats = 6 * error``. A wrong merge (a wrong adapter, a wrong scale) moves logprobs by
whole nats and fails it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

BF16_UNMERGED_ERROR_NATS = 0.034  # measured (large preset; small: 0.013), docs/modes.md
TOP_K = 5


class ProbeMismatchError(RuntimeError):
    """Greedy outputs differ between modes beyond the parity rule: the bench fails."""


@dataclass(frozen=True)
class StepTop:
    """One generated position as a side saw it."""

    token: int  # the greedy pick
    top: tuple[tuple[int, float], ...]  # (token id, logprob), best first, ``TOP_K`` entries


@dataclass(frozen=True)
class ParityRule:
    """How far merged outputs may differ from unmerged ones."""

    exact: bool  # every token must match (float32)
    top_k: int = TOP_K  # each side's token must be among the other side's top_k
    max_gap_nats: float = 6 * BF16_UNMERGED_ERROR_NATS  # unmerged side's logprob gap bound

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= TOP_K:
            raise ValueError(f"top_k {self.top_k} is invalid; expected 1 <= top_k <= {TOP_K}")
        if not self.max_gap_nats >= 0:
            raise ValueError(f"max_gap_nats {self.max_gap_nats} is invalid; expected >= 0")

    @classmethod
    def for_dtype(cls, dtype: str) -> ParityRule:
        """float32 exact; the 16-bit dtypes the near-tie rule."""
        return cls(exact=dtype == "float32")

    def describe(self) -> dict[str, object]:
        return {"exact": self.exact, "top_k": self.top_k, "max_gap_nats": self.max_gap_nats}


@dataclass(frozen=True)
class Divergence:
    """The first position where merged and unmerged picked different tokens."""

    position: int  # index into the generated tokens
    unmerged_token: int  # the unmerged side's pick
    merged_token: int  # the merged side's pick
    gap_nats: float | None  # unmerged logprob of its pick minus of merged's (None: not in top_k)
    near_tie: bool  # the rule accepts it

    def describe(self) -> dict[str, object]:
        return {"position": self.position, "gap_nats": self.gap_nats}


def step_tops(logits: torch.Tensor) -> list[StepTop]:
    """Per row of ``logits`` [rows, vocab]: the greedy pick and the top ``TOP_K`` logprobs."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logprobs.topk(TOP_K, dim=-1)
    picks = logits.argmax(dim=-1).tolist()
    return [
        StepTop(int(pick), tuple(zip(row_ids, row_values, strict=True)))
        for pick, row_ids, row_values in zip(picks, ids.tolist(), values.tolist(), strict=True)
    ]


def first_divergence(
    unmerged: Sequence[StepTop], merged: Sequence[StepTop], rule: ParityRule
) -> Divergence | None:
    """The first differing position of two greedy continuations of one prompt (None: identical),
    judged by ``rule``. Positions after it are not compared: the two contexts differ there."""
    if len(unmerged) != len(merged):
        raise ValueError(f"lengths {len(unmerged)} and {len(merged)} differ; expected equal")
    for position, (mine, theirs) in enumerate(zip(unmerged, merged, strict=True)):
        if mine.token == theirs.token:
            continue
        mine_top = dict(mine.top[: rule.top_k])
        theirs_top = dict(theirs.top[: rule.top_k])
        gap = None
        if theirs.token in mine_top and mine.token in mine_top:
            gap = mine_top[mine.token] - mine_top[theirs.token]
        near_tie = (
            not rule.exact
            and gap is not None
            and mine.token in theirs_top
            and gap < rule.max_gap_nats
        )
        return Divergence(position, mine.token, theirs.token, gap, near_tie)
    return None


@dataclass
class ParityReport:
    """Every comparison one bench run made under ``rule``, and the divergences it accepted
    (any other divergence raised :class:`ProbeMismatchError`)."""

    rule: ParityRule  # how merged may differ from unmerged
    compared: int = 0  # continuations compared
    accepted: list[tuple[str, Divergence]] = field(default_factory=list)  # (label, divergence)

    def check(
        self,
        label: str,
        unmerged: Sequence[StepTop],
        merged: Sequence[StepTop],
        rule: ParityRule | None = None,
    ) -> None:
        """Compare one continuation (``rule`` overrides the report's for this one)."""
        self.compared += 1
        got = first_divergence(unmerged, merged, rule or self.rule)
        if got is None:
            return
        if not got.near_tie:
            raise ProbeMismatchError(
                f"{label}: {[s.token for s in merged]}; expected {[s.token for s in unmerged]} "
                f"(first difference at {got.position}, unmerged logprob gap {got.gap_nats}; "
                f"rule {(rule or self.rule).describe()})"
            )
        self.accepted.append((label, got))

    def describe(self) -> dict[str, object]:
        return {
            "rule": self.rule.describe(),
            "compared": self.compared,
            "identical": self.compared - len(self.accepted),
            "num_divergences": len(self.accepted),
            "divergences": [{"what": label, **d.describe()} for label, d in self.accepted],
        }
