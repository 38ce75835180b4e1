"""``merge_deltas``: a consumer that reads queued deltas merged sees exactly what it would have
seen reading them one by one, for every field of ``TokenDelta`` (issue 25: logprobs,
prompt_logprobs and stop_reason were dropped by a merge that listed fields by hand).

Three guards:

- ``test_every_field_has_exactly_one_rule``: a field added to TokenDelta without a merge rule
  fails here (and at import of ``engine.protocol``);
- ``test_any_split_into_batches_reads_like_the_unsplit_output``: hypothesis splits one
  request's output into arbitrary consecutive batches, merges each batch, and compares what a
  consumer reads (``_read``, written independently of the rules) with the unsplit output;
- ``test_a_wrong_rule_for_any_field_is_caught``: the mutation check. Each field's rule replaced
  by a plausible wrong one (drop the earlier value, or the later) makes the same comparison fail,
  so the property test cannot pass with a rule missing or wrong. (``prompt_tokens`` is the same
  on every delta of a request, so any rule that keeps one of the two values is right for it.)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from functools import reduce
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.engine.protocol import DELTA_MERGE_RULES, TokenDelta, TokenLogprob, merge_deltas
from loraplex.engine.trace_log import TraceLog
from loraplex.residency.ledger import Tier
from loraplex.server.choices import ChoiceOutput

FIELDS = tuple(f.name for f in dataclasses.fields(TokenDelta))


def _logprob(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.1 * token - 0.01, 1, ((token, -0.1 * token - 0.01),))


def _output(
    num_tokens: int,
    *,
    logprobs: bool,
    prompt_logprobs: bool,
    finish: str,
    stop_reason: str | int | None,
    queue_s: float | None,
    tier: Tier | None,
    closing_abort: bool,
    traced: bool = True,
) -> list[TokenDelta]:
    """One request's deltas as the engine sends them: one per token, the first carrying the
    once-only fields, the last the finish and a traced request's engine trace (or an empty
    closing abort delta after them, carrying the trace)."""
    prompt = 5
    trace = TraceLog(0.0).finish(1.0, 0.1, base=True) if traced else None
    deltas = []
    for i in range(num_tokens):
        last = i == num_tokens - 1 and not closing_abort
        deltas.append(
            TokenDelta(
                token_ids=(100 + i,),
                text=f"<{i}>",
                finish_reason=finish if last else None,
                prompt_tokens=prompt,
                completion_tokens=i + 1,
                queue_s=queue_s if i == 0 else None,
                adapter_tier=tier if i == 0 else None,
                logprobs=(_logprob(100 + i),) if logprobs else None,
                prompt_logprobs=(
                    (None, *(_logprob(t) for t in range(1, prompt)))
                    if prompt_logprobs and i == 0
                    else None
                ),
                stop_reason=stop_reason if last and finish == "stop" else None,
                trace=trace if last else None,
            )
        )
    if closing_abort:
        deltas.append(TokenDelta((), "", "abort", prompt, num_tokens, trace=trace))
    return deltas


def _read(deltas: Sequence[TokenDelta]) -> dict[str, Any]:
    """What a consumer (the server's response builders, metrics) takes from a request's deltas,
    one key per TokenDelta field, computed without the merge rules."""
    logprobs = [lp for d in deltas for lp in (d.logprobs or ())]
    return {
        "token_ids": tuple(t for d in deltas for t in d.token_ids),
        "text": "".join(d.text for d in deltas),
        "finish_reason": deltas[-1].finish_reason,
        "prompt_tokens": deltas[-1].prompt_tokens,
        "completion_tokens": deltas[-1].completion_tokens,
        "queue_s": next((d.queue_s for d in deltas if d.queue_s is not None), None),
        "adapter_tier": next((d.adapter_tier for d in deltas if d.adapter_tier is not None), None),
        "logprobs": logprobs if any(d.logprobs is not None for d in deltas) else None,
        "prompt_logprobs": next(
            (d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None
        ),
        "stop_reason": deltas[-1].stop_reason,
        "trace": deltas[-1].trace,
    }


def _choice(deltas: Sequence[TokenDelta]) -> ChoiceOutput:
    out = ChoiceOutput()
    for delta in deltas:
        out.add(delta)
    return out


def _merged(
    deltas: Sequence[TokenDelta], cuts: Sequence[int], rules: Mapping[str, Any]
) -> list[TokenDelta]:
    """``deltas`` split before each index in ``cuts``, each batch merged into one delta."""
    bounds = [0, *sorted(set(cuts)), len(deltas)]
    batches = [deltas[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    return [reduce(lambda x, y: merge_deltas(x, y, rules), batch) for batch in batches]


def test_every_field_has_exactly_one_rule() -> None:
    assert set(DELTA_MERGE_RULES) == set(FIELDS)
    assert set(_read(_output(1, logprobs=True, prompt_logprobs=True, finish="stop",
                             stop_reason="x", queue_s=0.1, tier=Tier.L0,
                             closing_abort=False))) == set(FIELDS)  # fmt: skip


def test_a_rule_table_missing_a_field_is_refused() -> None:
    one = _output(2, logprobs=True, prompt_logprobs=False, finish="length", stop_reason=None,
                  queue_s=None, tier=None, closing_abort=False)  # fmt: skip
    rules = {k: v for k, v in DELTA_MERGE_RULES.items() if k != "logprobs"}
    with pytest.raises(TypeError, match="logprobs"):
        merge_deltas(one[0], one[1], rules)


outputs = st.builds(
    _output,
    st.integers(1, 12),
    logprobs=st.booleans(),
    prompt_logprobs=st.booleans(),
    finish=st.sampled_from(["stop", "length", "abort"]),
    stop_reason=st.one_of(st.none(), st.text(min_size=1, max_size=3), st.integers(0, 999)),
    queue_s=st.one_of(st.none(), st.floats(0, 10)),
    tier=st.one_of(st.none(), st.sampled_from(list(Tier))),  # Tier.L0 is 0: falsy
    closing_abort=st.booleans(),
    traced=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(outputs, st.data())
def test_any_split_into_batches_reads_like_the_unsplit_output(
    deltas: list[TokenDelta], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(1, max(1, len(deltas) - 1)), max_size=len(deltas)))
    merged = _merged(deltas, cuts, DELTA_MERGE_RULES)
    assert _read(merged) == _read(deltas)
    # What the non-streaming response and best_of ranking read, too.
    whole, split = _choice(deltas), _choice(merged)
    assert dataclasses.asdict(split) | {"parts": split.text} == dataclasses.asdict(whole) | {
        "parts": whole.text
    }


_WRONG: dict[str, Any] = {
    "drops the earlier value": lambda first, second: second,
    "drops the later value": lambda first, second: first,
}


@pytest.mark.parametrize("field", [f for f in FIELDS if f != "prompt_tokens"])
def test_a_wrong_rule_for_any_field_is_caught(field: str) -> None:
    deltas = _output(4, logprobs=True, prompt_logprobs=True, finish="stop", stop_reason="##",
                     queue_s=0.25, tier=Tier.L0, closing_abort=False)  # fmt: skip
    num_mutants = 0
    for name, wrong in _WRONG.items():
        rules = {**DELTA_MERGE_RULES, field: wrong}
        # The mutant must differ from the real rule on some batch of this output ...
        whole = reduce(lambda x, y: merge_deltas(x, y, rules), deltas)
        if getattr(whole, field) == getattr(reduce(merge_deltas, deltas), field):
            continue  # ... this mutant happens to be the field's real rule
        num_mutants += 1
        assert _read(_merged(deltas, [], rules)) != _read(deltas), f"{field}: {name} not caught"
    assert num_mutants >= 1
