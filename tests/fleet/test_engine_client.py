"""``FleetEngineClient`` over scripted replica streams: pass-through, domain errors unpacked,
retries after a lost replica (only before the first token), cancellation, the accept deadline,
and the load and health the board gives."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from fleet_fakes import (
    CharTokenizer,
    FakeCalls,
    FakeStream,
    LostReplica,
    StreamOpener,
    delta,
    entry,
    is_lost,
    key,
    load,
    polled_twice,
    request,
    started_link,
    wait_until,
)

from loraplex.engine.protocol import TokenDelta
from loraplex.engine.transport.packed_errors import pack_error
from loraplex.errors import EngineUnavailableError, QueueFullError, QueueTimeoutError
from loraplex.fleet import routing
from loraplex.fleet.engine_client import MAX_ATTEMPTS, FleetEngineClient
from loraplex.fleet.link import FleetLink
from loraplex.fleet.wire import Accepted, Failed, RouteHint


def _client(link: FleetLink, streams: list[FakeStream]) -> tuple[FleetEngineClient, StreamOpener]:
    opener = StreamOpener(streams)
    tokenizer: Any = CharTokenizer()  # what the client uses of a TextTokenizer
    return FleetEngineClient(opener, is_lost, link, tokenizer), opener


async def _collect(stream: Any) -> list[TokenDelta]:
    return [d async for d in stream]


def _texts(deltas: list[TokenDelta]) -> list[str]:
    return [d.text for d in deltas]


def _avoided(opener: StreamOpener) -> list[frozenset[str]]:
    return [hint.avoid for _, hint in opener.opened]


def test_items_pass_through(link: FleetLink) -> None:
    stream = FakeStream([Accepted("a"), delta("x"), delta("y", 2)])
    client, opener = _client(link, [stream])
    call = request(adapter=key())
    assert _texts(asyncio.run(_collect(client.generate(call)))) == ["x", "y"]
    ((sent, hint),) = opener.opened
    assert sent == call and hint == RouteHint()
    assert not stream.cancelled.is_set() and client.num_retries == 0


@pytest.mark.parametrize("after_token", [False, True])
def test_a_failed_stream_raises_the_domain_error_with_its_class(
    link: FleetLink, after_token: bool
) -> None:
    failed = Failed(pack_error(QueueFullError("tenant acme's queue", 8, 2.0)))
    items: list[Any] = [Accepted("a"), delta("x"), failed] if after_token else [failed]
    stream = FakeStream(items)
    client, opener = _client(link, [stream])
    with pytest.raises(QueueFullError) as raised:
        asyncio.run(_collect(client.generate(request())))
    assert (raised.value.what, raised.value.limit, raised.value.retry_after_s) == (
        "tenant acme's queue",
        8,
        2.0,
    )
    assert len(opener.opened) == 1 and stream.cancelled.is_set()


def test_a_replica_lost_before_the_first_token_is_avoided_on_the_retry(link: FleetLink) -> None:
    lost = FakeStream([Accepted("a"), LostReplica("a died")])
    good = FakeStream([Accepted("b"), delta("hi")])
    client, opener = _client(link, [lost, good])
    assert _texts(asyncio.run(_collect(client.generate(request())))) == ["hi"]
    assert _avoided(opener) == [frozenset(), frozenset({"a"})]
    assert client.num_retries == 1
    assert [r for r, _ in opener.opened] == [request(), request()]  # the same request again


def test_a_replica_lost_before_accepting_is_retried_without_a_name(link: FleetLink) -> None:
    client, opener = _client(
        link, [FakeStream([LostReplica("gone")]), FakeStream([Accepted("b"), delta("ok")])]
    )
    assert _texts(asyncio.run(_collect(client.generate(request())))) == ["ok"]
    assert _avoided(opener) == [frozenset(), frozenset()] and client.num_retries == 1


def test_a_replica_lost_after_a_token_fails_the_request(link: FleetLink) -> None:
    client, opener = _client(link, [FakeStream([Accepted("a"), delta("x"), LostReplica("a")])])
    received: list[TokenDelta] = []

    async def run() -> None:
        async for d in client.generate(request("req-9")):
            received.append(d)

    with pytest.raises(EngineUnavailableError, match="request req-9 was lost"):
        asyncio.run(run())
    assert _texts(received) == ["x"] and len(opener.opened) == 1 and client.num_retries == 0


def test_at_most_max_attempts_are_made(link: FleetLink) -> None:
    replicas = ["a", "b", "c", "d", "e"]
    streams = [FakeStream([Accepted(rid), LostReplica(rid)]) for rid in replicas]
    client, opener = _client(link, streams)
    with pytest.raises(EngineUnavailableError):
        asyncio.run(_collect(client.generate(request())))
    assert len(opener.opened) == MAX_ATTEMPTS
    assert client.num_retries == MAX_ATTEMPTS - 1
    assert _avoided(opener)[-1] == frozenset(replicas[: MAX_ATTEMPTS - 1])


def test_other_errors_are_not_retried(link: FleetLink) -> None:
    client, opener = _client(link, [FakeStream([Accepted("a"), ValueError("bug")])])
    with pytest.raises(ValueError, match="bug"):
        asyncio.run(_collect(client.generate(request())))
    assert len(opener.opened) == 1 and client.num_retries == 0


def test_closing_the_consumers_iterator_cancels_the_stream(link: FleetLink) -> None:
    stream = FakeStream([Accepted("a"), delta("x")], hold=True)
    client, _ = _client(link, [stream])

    async def read_one_then_leave() -> str:
        deltas = client.generate(request("req-2"))
        first = await anext(deltas)
        await deltas.aclose()  # type: ignore[attr-defined]
        return first.text

    assert asyncio.run(read_one_then_leave()) == "x"
    assert stream.cancelled.is_set()
    assert client._live == {}


def test_abort_cancels_the_live_stream(link: FleetLink) -> None:
    stream = FakeStream([Accepted("a"), delta("x")], hold=True)
    client, _ = _client(link, [stream])

    async def abort_after_first() -> list[str]:
        deltas = client.generate(request("req-3"))
        texts = [(await anext(deltas)).text]
        await client.abort("unknown-id")
        assert not stream.cancelled.is_set()
        await client.abort("req-3")
        texts += [d.text async for d in deltas]  # the held stream ends once cancelled
        return texts

    assert asyncio.run(abort_after_first()) == ["x"]
    assert stream.cancelled.is_set()


def test_no_first_item_within_the_deadline_is_a_queue_timeout(link: FleetLink) -> None:
    stream = FakeStream([], hold=True)
    client, _ = _client(link, [stream])
    with pytest.raises(QueueTimeoutError) as raised:
        asyncio.run(_collect(client.generate(request("req-4", deadline_s=0.05))))
    assert raised.value.request_id == "req-4"
    assert stream.cancelled.is_set()


def test_generate_on_targets_one_replica_and_never_retries(link: FleetLink) -> None:
    client, opener = _client(
        link,
        [FakeStream([Accepted("b"), delta("p")]), FakeStream([Accepted("b"), LostReplica("b")])],
    )
    assert _texts(asyncio.run(_collect(client.generate_on("b", request())))) == ["p"]
    with pytest.raises(LostReplica):
        asyncio.run(_collect(client.generate_on("b", request())))
    assert [hint for _, hint in opener.opened] == [RouteHint(target="b")] * 2
    assert client.num_retries == 0


def test_load_snapshot_sums_the_healthy_replicas(calls: FakeCalls, link: FleetLink) -> None:
    one, two, three = key("one"), key("two"), key("three")
    a = load(1, 2, 0.2, running_adapters=(one,), waiting_adapters=(two,))
    b = load(3, 4, 0.6, running_adapters=(two,), waiting_adapters=(three,))
    calls.board = [
        entry(
            "a",
            engine_load=dataclasses.replace(
                a, num_resume_recomputed_tokens=30, lora_running=(one,), lora_waiting=(one, two)
            ),
        ),
        entry(
            "b",
            engine_load=dataclasses.replace(
                b, num_resume_recomputed_tokens=12, lora_running=(three,), lora_waiting=(two,)
            ),
        ),
        entry("c", healthy=False, engine_load=load(50, 50, 1.0)),
    ]
    polled_twice(link)
    client, _ = _client(link, [])
    total = client.load_snapshot()
    assert (total.num_waiting, total.num_running, total.max_loras) == (4, 6, 4)
    assert total.kv_usage == pytest.approx(0.4) and total.num_active_tokens == 100
    assert total.running_adapters == (one, two) and total.waiting_adapters == (three,)
    assert total.num_resume_recomputed_tokens == 42
    # vllm:lora_requests_info's lists: each adapter with a request in that state on any replica
    assert total.lora_running == (one, three) and total.lora_waiting == (one, two)


def test_health_answers_from_the_board(calls: FakeCalls, link: FleetLink) -> None:
    client, _ = _client(link, [])
    assert client.health().up and client.health().num_restarts == 0
    assert not client.health().starting
    calls.board = [entry("b", healthy=False)]
    wait_until(lambda: link.num_departed == 1, "a departed")
    health = client.health()
    assert not health.up and health.num_restarts == 1
    assert health.down_reason == "none of the 1 engine replicas is healthy"
    assert not health.starting  # down: it has been up
    with pytest.raises(EngineUnavailableError):
        client.load_snapshot()
    calls.board = []
    polled_twice(link)
    assert client.health().down_reason == "no engine replica has reported yet"
    assert not client.health().starting  # replicas departed: not a first start


def test_a_fleet_no_replica_reported_to_yet_is_starting() -> None:
    """/health says "starting" (not "down") until the first replica reports."""
    built = started_link(FakeCalls(board=[]))
    try:
        client, _ = _client(built, [])
        health = client.health()
        assert not health.up and health.starting
    finally:
        built.close()


def test_an_attempt_without_a_first_token_is_withdrawn_from_the_topology(
    link: FleetLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only admitted work weighs toward a dedication (``routing.UNADMITTED``): a refused
    request, and a lost attempt before its retry (counted again when routed again). A request
    that had its first token is ``ended`` when it ends: no longer its replica's load."""
    seen: list[tuple[str, str, str]] = []
    fake = SimpleNamespace(
        admitted=lambda tenant, rid: seen.append(("admitted", tenant, rid)),
        withdraw=lambda tenant, rid: seen.append(("withdraw", tenant, rid)),
        ended=lambda tenant, rid: seen.append(("ended", tenant, rid)),
    )
    monkeypatch.setattr(routing, "UNADMITTED", fake)
    refused = FakeStream([Failed(pack_error(QueueFullError("tenant acme's queue", 8, 2.0)))])
    client, _ = _client(link, [refused])
    with pytest.raises(QueueFullError):
        asyncio.run(_collect(client.generate(request("r1"))))
    assert seen == [("withdraw", "acme", "r1")]
    seen.clear()
    lost = FakeStream([Accepted("a"), LostReplica("a died")])
    good = FakeStream([Accepted("b"), delta("hi"), delta("!", 2)])
    client, _ = _client(link, [lost, good])
    assert _texts(asyncio.run(_collect(client.generate(request("r2"))))) == ["hi", "!"]
    assert seen == [("withdraw", "acme", "r2"), ("admitted", "acme", "r2"), ("ended", "acme", "r2")]
