"""The engine core's record of one live request: what the core keeps for it beside the
scheduler's ``Request`` (its stream, its output tracker, a lease still loading, what its first
delta still owes). One record per live request, keyed by request id, so retiring a request is
one removal (``EngineCore._retire``), and ``check_records`` says whether the records and the
scheduler agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from loraplex.engine.output import OutputTracker
from loraplex.engine.protocol import TokenDelta, TokenLogprob
from loraplex.engine.request import Request, RequestState
from loraplex.residency.cache import Lease
from loraplex.residency.ledger import Tier

# Receives a request's deltas, or the error that ended it; called on the engine thread.
Sink = Callable[[TokenDelta | BaseException], None]


class LiveRecordError(RuntimeError):
    """An engine bug: the core's per-request records and the scheduler's requests disagree."""


@dataclass(eq=False)
class Live:
    """The core's state of one live request (the scheduler owns ``req``'s state, KV and lease)."""

    req: Request  # the scheduler's progress of this request
    sink: Sink  # where its deltas (or the error that ends it) go
    output: OutputTracker  # detokenization, stop conditions, finish reason
    lease_future: Future[Lease] | None = None  # set while ADAPTER_WAIT: its adapter is loading
    lease_tier: Tier | None = None  # tier its lease came from, until its first delta says so
    # Prompt position -> its logprobs, until the first delta carries them (None: not asked).
    prompt_logprobs: dict[int, TokenLogprob] | None = None


def check_records(
    lives: Mapping[str, Live],
    requests: Mapping[str, Request],
    num_traced: int,
    runner_streams: Collection[str],
) -> None:
    """Raises LiveRecordError naming the first broken invariant: one record per live request
    of the scheduler, and each record's fields only in the states that own them."""
    if lives.keys() != requests.keys():
        extra, missing = sorted(lives.keys() - requests.keys()), sorted(requests - lives.keys())
        raise LiveRecordError(f"records {extra} have no live request; requests {missing} no record")
    for request_id, live in lives.items():
        req = live.req
        if requests[request_id] is not req:
            raise LiveRecordError(f"{request_id}: its record holds another Request")
        if (live.lease_future is not None) != (req.state is RequestState.ADAPTER_WAIT):
            raise LiveRecordError(f"{request_id}: a lease future while {req.state.value}")
        if live.lease_tier is not None and (req.lease is None or live.output.token_ids):
            raise LiveRecordError(f"{request_id}: a lease tier without a lease or past token 1")
        asked = req.request.params.prompt_logprobs is not None
        if live.prompt_logprobs is not None and (not asked or req.output_token_ids):
            raise LiveRecordError(f"{request_id}: prompt logprobs owed past its first token")
    traced = sum(1 for live in lives.values() if live.req.trace_log is not None)
    if traced != num_traced:
        raise LiveRecordError(f"{num_traced} traced requests counted; {traced} live")
    stale = sorted(set(runner_streams) - lives.keys())
    if stale:
        raise LiveRecordError(f"the runner keeps random streams of retired requests {stale}")
