"""Fakes for the fleet's Ray-free parts: the deployments' calls (``ReplicaCalls``), board
statuses, replica streams, reports and requests. No Ray process is started."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineLoad, EngineRequest, TokenDelta
from loraplex.engine.transport.messages import CacheCommand
from loraplex.fleet.board import BoardEntry
from loraplex.fleet.link import FleetLink
from loraplex.fleet.report_cache import SEQ_KEY
from loraplex.fleet.wire import RouteHint
from loraplex.residency.cache.view import CacheSummary
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import CacheStatsSnapshot
from loraplex.router.reports import ReplicaLoad, ReplicaReport, Residency, encode_report
from loraplex.sampling import SamplingParams

WAIT_S = 10.0  # upper bound of every wait (a failure, not a timing assertion)
POLL_S = 0.01  # the links' board poll interval in tests
REPORT_NUMBERS = itertools.count()  # every faked report's number (``report_cache``): a new one each
BASE_DIGEST = "b" * 64


def key(name: str = "support", tenant: str = "acme", revision: str = "r1") -> AdapterKey:
    return AdapterKey(BASE_DIGEST, tenant, name, revision, "a" * 64)


def request(
    request_id: str = "req-1",
    adapter: AdapterKey | None = None,
    *,
    tenant: str = "acme",
    session: str | None = None,
    num_tokens: int = 3,
    deadline_s: float | None = None,
) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        tenant=tenant,
        adapter_key=adapter,
        prompt_token_ids=tuple(range(4, 4 + num_tokens)),
        params=SamplingParams(max_tokens=4),
        deadline_s=deadline_s,
        session_key=session,
    )


def delta(text: str, count: int = 1) -> TokenDelta:
    return TokenDelta((7,), text, None, 3, count)


def report(
    replica_id: str,
    at_s: float = 1.0,
    *,
    l0: Iterable[str] = (),
    l1: Iterable[str] = (),
    num_queued: int = 0,
) -> ReplicaReport:
    residency = Residency(l0=frozenset(l0), l1=frozenset(l1))
    return ReplicaReport(replica_id, at_s, residency, ReplicaLoad(num_queued=num_queued))


def load(
    waiting: int = 0,
    running: int = 0,
    kv_usage: float = 0.0,
    running_adapters: tuple[AdapterKey, ...] = (),
    waiting_adapters: tuple[AdapterKey, ...] = (),
) -> EngineLoad:
    return EngineLoad(
        num_waiting=waiting,
        num_adapter_wait=0,
        num_running=running,
        kv_usage=kv_usage,
        running_adapters=running_adapters,
        waiting_adapters=waiting_adapters,
        max_loras=2,
        num_active_tokens=10 * (waiting + running),
    )


def summary(copies: int = 1, used: int = 100, hits: int = 0) -> CacheSummary:
    stats = CacheStatsSnapshot(
        hits={Tier.L0: hits},
        misses=0,
        loads={},
        evictions={},
        reloads_after_eviction={},
        load_failures=0,
        resident_count={Tier.L1: copies},
        resident_bytes={Tier.L1: used},
        stages={},
        room_wait=None,
    )
    return CacheSummary(
        stats=stats,
        num_loading=0,
        num_blocked=0,
        used_bytes={Tier.L1: used},
        capacity_bytes={Tier.L1: 1000},
        num_copies={Tier.L1: copies},
    )


def status(
    replica_id: str,
    *,
    healthy: bool = True,
    reported: ReplicaReport | None = None,
    engine_load: EngineLoad | None = None,
    cache_summary: CacheSummary | None = None,
) -> dict[str, Any]:
    """A board status as ``EngineReplica.status()`` makes it (the parts the ingress reads)."""
    return {
        "replica_id": replica_id,
        "healthy": healthy,
        "report": encode_report(reported or report(replica_id)),
        SEQ_KEY: next(REPORT_NUMBERS),
        "load": engine_load or load(),
        "summary": cache_summary or summary(),
    }


def entry(replica_id: str, age_s: float = 0.0, **kw: Any) -> BoardEntry:
    return BoardEntry(replica_id, status(replica_id, **kw), age_s)


CacheReply = Callable[[str, CacheCommand], Any]


@dataclass
class FakeCalls:
    """``ReplicaCalls`` over a board the test sets and replicas that answer with ``reply``
    (its exception is the call's); a replica id in ``gates`` answers once its event is set."""

    board: list[BoardEntry] = field(default_factory=list)
    reply: CacheReply = lambda replica_id, command: None
    gates: dict[str, threading.Event] = field(default_factory=dict)
    board_error: Exception | None = None  # raised by board_entries while set
    calls: list[tuple[str, CacheCommand]] = field(default_factory=list)  # in order of arrival
    done: list[str] = field(default_factory=list)  # replica ids whose call returned
    num_board_reads: int = 0  # board_entries calls, failed ones included

    async def board_entries(self) -> list[BoardEntry]:
        self.num_board_reads += 1
        if self.board_error is not None:
            raise self.board_error
        return list(self.board)

    async def cache_call(self, replica_id: str, command: CacheCommand) -> Any:
        self.calls.append((replica_id, command))
        gate = self.gates.get(replica_id)
        while gate is not None and not gate.is_set():
            await asyncio.sleep(POLL_S)
        try:
            return self.reply(replica_id, command)
        finally:
            self.done.append(replica_id)

    def commands_to(self, replica_id: str) -> list[CacheCommand]:
        return [c for rid, c in list(self.calls) if rid == replica_id]


def started_link(calls: FakeCalls) -> FleetLink:
    """A link that has read the board once."""
    link = FleetLink(calls, poll_interval_s=POLL_S)
    assert link.wait_polled(WAIT_S)
    return link


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {WAIT_S} s: {what}")
        time.sleep(POLL_S)


def polled_twice(link: FleetLink) -> None:
    """Returns after two more board polls (so a change of the board has been seen)."""
    seen = threading.Event()
    count = [0]

    def listener(_: list[BoardEntry]) -> None:
        count[0] += 1
        if count[0] >= 2:
            seen.set()

    link.on_entries(listener)
    assert seen.wait(WAIT_S)


class CharTokenizer:
    """One token per character (enough for the probes' prompts)."""

    eos_token_ids = frozenset({2})

    def encode(self, text: str) -> list[int]:
        return [1, *(ord(c) + 3 for c in text)]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t - 3) for t in token_ids if t >= 3)


class LostReplica(Exception):
    """What the fakes raise for a replica that died (``is_lost`` says so)."""


def is_lost(exc: BaseException) -> bool:
    return isinstance(exc, LostReplica)


class FakeStream:
    """A replica's ``generate`` stream: yields ``items`` in order; an exception among them is
    raised there; ``hold`` (after the items) waits until cancelled instead of ending."""

    def __init__(self, items: list[Any], *, hold: bool = False) -> None:
        self._items = items
        self._hold = hold
        self.cancelled = threading.Event()
        self.num_read = 0  # items handed out

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._run()

    async def _run(self) -> AsyncIterator[Any]:
        for item in self._items:
            if isinstance(item, BaseException):
                raise item
            self.num_read += 1
            yield item
        while self._hold and not self.cancelled.is_set():
            await asyncio.sleep(POLL_S)

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class StreamOpener:
    """``open_stream`` handing out scripted streams in order and recording each call."""

    streams: list[FakeStream]
    opened: list[tuple[EngineRequest, RouteHint]] = field(default_factory=list)

    def __call__(self, request: EngineRequest, hint: RouteHint) -> FakeStream:
        self.opened.append((request, hint))
        return self.streams[len(self.opened) - 1]
