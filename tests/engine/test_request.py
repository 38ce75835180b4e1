from __future__ import annotations

import pytest
from sched_kit import FakeLease, adapter, request

from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.request import IllegalTransitionError, Request, RequestState
from loraplex.sampling import SamplingParams


def _req(key: bool = False) -> Request:
    return Request(request("r", key=adapter("x") if key else None), 0.0, 10.0)


def test_happy_path_and_terminal_states() -> None:
    req = _req(key=True)
    assert req.lease is None and req.request.adapter_key is not None
    req.transition(RequestState.ADAPTER_WAIT)
    req.lease = FakeLease(slot=3)
    req.transition(RequestState.WAITING)
    assert req.adapter_ready and req.slot == 3
    req.transition(RequestState.RUNNING)
    req.transition(RequestState.WAITING)  # preemption
    req.transition(RequestState.RUNNING)
    req.transition(RequestState.FINISHED)
    for state in RequestState:
        with pytest.raises(IllegalTransitionError):
            req.transition(state)


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ((), RequestState.FINISHED),
        ((RequestState.ADAPTER_WAIT,), RequestState.RUNNING),
        ((RequestState.ADAPTER_WAIT,), RequestState.FINISHED),
        ((RequestState.RUNNING,), RequestState.ADAPTER_WAIT),
        ((RequestState.ABORTED,), RequestState.WAITING),
    ],
)
def test_illegal_edges_are_refused(path: tuple[RequestState, ...], bad: RequestState) -> None:
    req = _req()
    for state in path:
        req.transition(state)
    before = req.state
    with pytest.raises(IllegalTransitionError):
        req.transition(bad)
    assert req.state is before


def test_abort_from_every_live_state() -> None:
    for path in ((), (RequestState.ADAPTER_WAIT,), (RequestState.RUNNING,)):
        req = _req()
        for state in path:
            req.transition(state)
        req.transition(RequestState.ABORTED)
        assert req.state is RequestState.ABORTED


def test_base_model_request_is_ready_and_token_ids_grow() -> None:
    req = _req()
    assert req.adapter_ready and req.slot is None
    req.output_token_ids += [9, 8]
    assert req.token_ids() == [1, 2, 3, 4, 9, 8] and req.num_tokens == 6


def test_engine_request_validation() -> None:
    params = SamplingParams()
    with pytest.raises(ValueError, match="prompt_token_ids"):
        EngineRequest("r", "a", None, (), params)
    with pytest.raises(ValueError, match="deadline_s"):
        EngineRequest("r", "a", None, (1,), params, deadline_s=0)
    with pytest.raises(ValueError, match="request_id"):
        EngineRequest("", "a", None, (1,), params)
    delta = TokenDelta((1,), "x", None, 3, 1)
    assert delta.finish_reason is None
