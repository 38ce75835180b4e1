"""What ``loraplex serve`` refuses at once, before queueing (a 400 ``context_length_exceeded``:
a prompt of ``max_model_len`` tokens or more, or a prompt plus its ``max_tokens`` beyond the
context), the simulator refuses at arrival (``sim/refusal.py``): no route, no hop, no engine; the
request counts in ``refused`` and in no TTFT percentile, as ``bench sim``'s real side counts a
400 reply. Before, the engine's own check refused a too-long prompt after its hop, counted at
``timeout_s`` (60 s) in every percentile, and a prompt plus output beyond the context ran and
completed, cut at ``max_model_len`` tokens, where the server answers it with a 400."""

from __future__ import annotations

import pytest
from sim_inputs import cost

from loraplex.errors import ContextLengthError
from loraplex.sampling import check_prompt_room, fit_max_tokens
from loraplex.server.errors import context_error
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.refusal import CONTEXT_CODE, CONTEXT_STATUS, refusal
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

# Served requests: three adapters, 32 prompt tokens and 8 out, every 0.1 s.
_SERVED = [TraceRecord(0.1 * i, "t", f"a{i % 3}", 32, 8) for i in range(30)]
# Refused by a 512-token context: prompts of 512 and 600 tokens (no room for a token), and
# 500 + 100 out (beyond it with the output the client asks for as max_tokens).
_OVER = [TraceRecord(0.05 + 0.3 * i, "t", "a0", 512 + 88 * (i % 2), 8) for i in range(6)] + [
    TraceRecord(0.07 + 0.3 * i, "u", "a1", 500, 100) for i in range(4)
]


def _with_over() -> list[TraceRecord]:
    return sorted(_SERVED + _OVER, key=lambda r: r.t_s)


@pytest.mark.parametrize("replicas", [1, 3])
def test_over_long_requests_are_refused_at_arrival_and_leave_the_percentiles_alone(
    replicas: int,
) -> None:
    config = SimConfig(replicas=replicas, max_model_len=512)
    served = simulate(_SERVED, config, cost()).metrics
    outcomes: list[Outcome] = []
    mixed = simulate(_with_over(), config, cost(), keep_outcomes=outcomes).metrics
    assert mixed["refused"] == {CONTEXT_CODE: len(_OVER)}
    assert mixed["errors"] == {} and served["refused"] == {}
    assert (mixed["requests"], mixed["completed"]) == (len(_SERVED) + len(_OVER), len(_SERVED))
    for key in ("ttft_ms", "ttft_ms_warm", "ttft_ms_cold", "tier_at_lease", "hit_ratio"):
        assert mixed[key] == served[key], key
    assert mixed["ttft_ms"]["n"] == len(_SERVED)
    assert mixed["by_tenant"]["u"]["ttft_ms"] == {"n": 0, "p50": None, "p90": None, "p99": None}
    refused = [o for o in outcomes if o.refused is not None]
    assert len(refused) == len(_OVER)
    for o in refused:  # ended at its arrival, never routed nor leased
        assert (o.end_s, o.replica, o.tier, o.first_token_s) == (o.t_s, -1, None, None)
        assert o.error == "ContextLengthError" and not o.ok
    if replicas > 1:
        assert mixed["decisions"] == served["decisions"]
        assert mixed["requests_per_replica"] == served["requests_per_replica"]


def test_a_request_that_fills_the_context_exactly_is_served() -> None:
    """The server's bounds: 511 prompt tokens and 1 out, and 500 + 12, fit a 512-token context;
    one token more of either is refused."""
    config = SimConfig(max_model_len=512)
    fits = [TraceRecord(0.0, "t", "a", 511, 1), TraceRecord(1.0, "t", "a", 500, 12)]
    assert [refusal(r, 512) for r in fits] == [None, None]
    metrics = simulate(fits, config, cost()).metrics
    assert metrics["completed"] == 2 and metrics["refused"] == {}
    over = [TraceRecord(0.0, "t", "a", 512, 1), TraceRecord(1.0, "t", "a", 500, 13)]
    assert simulate(over, config, cost()).metrics["refused"] == {CONTEXT_CODE: 2}


def test_the_refusal_is_the_servers_answer() -> None:
    """The rules are ``sampling``'s, which the server applies (``server/prompts.py``,
    ``server/submit.py``); the status and code are what the server maps them to."""
    long_prompt = refusal(TraceRecord(0.0, "t", "a", 600, 8), 512)
    with pytest.raises(ContextLengthError) as prompt_error:
        check_prompt_room(600, 512)
    long_output = refusal(TraceRecord(0.0, "t", "a", 500, 100), 512)
    with pytest.raises(ContextLengthError) as output_error:
        fit_max_tokens(100, 500, 512, "max_tokens")
    for answer, error in ((long_prompt, prompt_error), (long_output, output_error)):
        assert answer is not None
        api = context_error(error.value)
        assert (answer.status, answer.code, answer.message) == (api.status, api.code, api.message)
        assert (api.status, api.code) == (CONTEXT_STATUS, CONTEXT_CODE)
    assert output_error.value.param == "max_tokens" and prompt_error.value.param == "prompt"
