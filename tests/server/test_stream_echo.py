"""Streamed ``echo`` with logprobs at its largest, at the default stream settings: each choice's
first event carries its whole prompt's logprobs (about 290 KB with ``logprobs: 20`` on a
500-token prompt), larger than ``max_stream_buffer_bytes`` (256 KiB) and than
``stream_pause_bytes`` (64 KiB). Counted against them, two such events back to back ended an
honest client's stream with ``stream_not_read``. An honest client now gets its whole stream,
equal to the non-streamed answer; one that stops reading is still paused, cut off and bounded
(``server/stream_buffer.py``: ``EchoEvent``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live import Live, live_server
from stuck_client import (
    QUEUE_DEADLINE_S,
    num_ended,
    open_not_reading,
    read_all,
    read_response,
    serving,
    wait_engine_freed,
    wait_until,
)

from loraplex.demo.assets import DemoAssets
from loraplex.sampling import MAX_LOGPROBS
from loraplex.serve.config import ServeConfig
from loraplex.server.choices import DEFAULT_MAX_CHOICES
from loraplex.server.listeners import ConnectionLimits
from loraplex.server.protocol import MAX_TOP_LOGPROBS
from loraplex.server.stream_buffer import Backpressure, EchoEvent, bounded
from loraplex.server.streaming import not_read_event, resumed_too_often_event

WORDS = ("The acme support team is early and green the cat watches my train " * 60).split()
PROMPT_TOKENS = 500  # of max_model_len 512: room for the generated tokens below
_LOGPROB_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")

# --- the buffer alone ------------------------------------------------------------------------


class Source:
    """``num_echoes`` echo events of 5,000 characters, then ``num_counted`` of 100; records how
    many were read when the request was paused, and the pauses and resumes."""

    def __init__(self, num_echoes: int, num_counted: int) -> None:
        self.num_echoes, self.num_counted = num_echoes, num_counted
        self.num_read = 0
        self.calls: list[tuple[str, int]] = []  # ("pause" | "resume", events read by then)

    def texts(self) -> list[str]:
        echoes = [EchoEvent(f"{i % 10}" * 5000) for i in range(self.num_echoes)]
        return [*echoes, *(f"{i % 10}" * 100 for i in range(self.num_counted))]

    async def stream(self) -> AsyncIterator[str]:
        for text in self.texts():
            self.num_read += 1
            yield text
            await asyncio.sleep(0)

    async def pause(self) -> None:
        self.calls.append(("pause", self.num_read))

    async def resume(self) -> None:
        self.calls.append(("resume", self.num_read))

    def backpressure(self, pause_bytes: int) -> Backpressure:
        return Backpressure(pause_bytes, self.pause, self.resume, 0, resumed_too_often_event)


async def _no_abort() -> None:
    pass


async def _stalled(stream: AsyncIterator[str]) -> list[str]:
    """The first piece, a stall of the writer (its client reads nothing), then the rest."""
    pieces = [await anext(stream)]
    for _ in range(200):
        await asyncio.sleep(0)
    return pieces + [piece async for piece in stream]


def test_echo_events_pass_a_stalled_writer_whole_and_never_pause() -> None:
    """Twenty echo events of 5,000 bytes behind a stalled writer: 100 KB waiting against a
    1,000-byte buffer and a 500-byte pause bound, with no resume allowed; all arrive."""
    source = Source(20, 3)
    stream = bounded(source.stream(), 1000, not_read_event, _no_abort, source.backpressure(500))
    pieces = asyncio.run(_stalled(stream))
    assert "".join(pieces) == "".join(source.texts())
    assert source.calls == []


def test_counted_events_behind_echo_events_still_pause_at_the_bound() -> None:
    source = Source(4, 10_000)
    stream = bounded(source.stream(), 1 << 20, not_read_event, _no_abort, source.backpressure(500))

    async def run() -> None:
        await anext(stream)
        for _ in range(200):
            await asyncio.sleep(0)
        await stream.aclose()

    asyncio.run(run())
    # the first echo event went to the writer: three wait uncounted; the fifth 100-byte event
    # reaches 500
    assert source.calls == [("pause", 4 + 5)]


def test_counted_events_behind_echo_events_still_overflow_at_the_bound() -> None:
    source = Source(4, 10_000)
    stream = bounded(source.stream(), 1000, not_read_event, _no_abort)
    pieces = asyncio.run(_stalled(stream))
    # the first echo event sent, three held, ten counted held, the one that did not fit
    assert source.num_read == 4 + 10 + 1
    assert pieces[-1] == not_read_event(1000)


# --- a real server and engine ----------------------------------------------------------------


@pytest.fixture(scope="module")
def live(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Default settings (the stream limits above among them) but the queue deadline; the engine
    in-process only to start faster: the stream buffer is in the front either way.
    NOTE: the 16 echoed prompts (8,000 tokens, all logits) take 16 steps of
    ``max_num_batched_tokens`` 512, and each sibling waits in the queue until its first one: on
    a loaded machine the last siblings waited past the default ``queue_deadline_s`` (30 s) and
    the request failed with ``queue_timeout`` (a 503, or an error event in the stream); with
    every step made 2.5 s slower the 13th sibling waited 32 s. The deadline is not what these
    tests check."""
    data_dir = tmp_path_factory.mktemp("stream-echo")
    config = {"engine_process": False, "queue_deadline_s": QUEUE_DEADLINE_S}
    with live_server(demo_assets, data_dir, **config) as server:
        yield server


def _prompt(num_tokens: int) -> str:
    return " ".join(WORDS[: num_tokens - 1])  # and BOS


def _post(url: str, key: str, body: dict[str, Any], path: str = "completions") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    reply = httpx.post(f"{url}/v1/{path}", json=body, headers=headers, timeout=300)
    assert reply.status_code == 200, reply.text[:500]
    return reply


def _assert_close(got: object, expected: object, where: str = "") -> None:
    """Equal, but for floats within 1e-4: a logprob differs in its last digits with the batch
    it was computed in (the streamed and the non-streamed request run one after the other)."""
    if isinstance(expected, float):
        assert isinstance(got, float) and abs(got - expected) <= 1e-4, (where, got, expected)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), (where, got, expected)
        for key, value in expected.items():
            _assert_close(got[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (where, got, expected)
        for index, (item, value) in enumerate(zip(got, expected, strict=True)):
            _assert_close(item, value, f"{where}[{index}]")
    else:
        assert got == expected, (where, got, expected)


def _chunks(text: str) -> Iterator[dict[str, Any]]:
    """A stream's chunks; fails unless it ended well."""
    assert text.endswith("data: [DONE]\n\n"), text[-500:]
    for line in text.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[len("data: ") :])
            assert "error" not in chunk, chunk
            yield chunk


def _streamed_choices(text: str) -> dict[int, dict[str, Any]]:
    """Each choice's text and logprobs, its events' concatenated."""
    choices: dict[int, dict[str, Any]] = {}
    for chunk in _chunks(text):
        for choice in chunk["choices"]:
            got = choices.setdefault(choice["index"], {"text": ""} | {k: [] for k in _LOGPROB_KEYS})
            got["text"] += choice["text"]
            for key in _LOGPROB_KEYS if choice["logprobs"] is not None else ():
                got[key] += choice["logprobs"][key]
    return choices


@pytest.mark.parametrize(
    ("num_prompts", "n", "max_tokens"),
    [(DEFAULT_MAX_CHOICES, 1, 0), (1, DEFAULT_MAX_CHOICES, 8)],
    ids=["16-prompts-echo-only", "n16-generating"],
)
def test_a_streamed_echo_at_the_largest_logprobs_completes_at_defaults(
    live: Live, num_prompts: int, n: int, max_tokens: int
) -> None:
    prompt = _prompt(PROMPT_TOKENS)
    assert len(live.server.engine.tokenizer.encode(prompt)) == PROMPT_TOKENS
    body = {"model": "support", "prompt": [prompt] * num_prompts, "n": n,
            "max_tokens": max_tokens, "echo": True, "logprobs": MAX_LOGPROBS,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    key = live.key("acme")
    answer = _post(live.url, key, body).json()
    streamed = _streamed_choices(_post(live.url, key, body | {"stream": True}).text)
    expected = {c["index"]: {"text": c["text"], **c["logprobs"]} for c in answer["choices"]}
    assert sorted(streamed) == list(range(DEFAULT_MAX_CHOICES))
    _assert_close(streamed, expected)  # the same text, tokens, logprobs, top logprobs, offsets
    assert all(len(c["tokens"]) == PROMPT_TOKENS + max_tokens for c in expected.values())


def test_a_streamed_chat_at_the_largest_logprobs_and_n_completes_at_defaults(live: Live) -> None:
    """No echo here: the stream is many small events (one token with 20 alternatives each, 16
    choices), 3.5 MB in all; the same content and logprobs as the non-streamed answer."""
    body = {"model": "support", "messages": [{"role": "user", "content": _prompt(100)}],
            "n": DEFAULT_MAX_CHOICES, "max_tokens": 100, "logprobs": True,
            "top_logprobs": MAX_TOP_LOGPROBS, "temperature": 0, "ignore_eos": True}  # fmt: skip
    key = live.key("acme")
    answer = _post(live.url, key, body, "chat/completions").json()
    streamed: dict[int, dict[str, Any]] = {}
    for chunk in _chunks(_post(live.url, key, body | {"stream": True}, "chat/completions").text):
        for choice in chunk["choices"]:
            got = streamed.setdefault(choice["index"], {"content": "", "logprobs": []})
            got["content"] += choice["delta"]["content"] or ""
            got["logprobs"] += (choice["logprobs"] or {"content": []})["content"]
    expected = {
        c["index"]: {"content": c["message"]["content"], "logprobs": c["logprobs"]["content"]}
        for c in answer["choices"]
    }
    assert sorted(streamed) == list(range(DEFAULT_MAX_CHOICES))
    _assert_close(streamed, expected)
    assert all(len(c["logprobs"]) == 100 for c in expected.values())


# n=16 of a 200-token prompt with logprobs 20 and far more generation than the stream bounds
# hold: its non-streamed answer is 4.8 MB, its echoed prompts most of the first 2 MB of the stream
STUCK_ECHO = {"model": "support", "prompt": _prompt(200), "n": DEFAULT_MAX_CHOICES,
              "max_tokens": 300, "echo": True, "logprobs": MAX_LOGPROBS, "ignore_eos": True,
              "stream": True}  # fmt: skip


def test_a_client_that_stops_reading_mid_echo_is_cut_off_at_defaults(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Default stream settings (a short write timeout only): cut off at the write timeout (paused
    before, unless the timeout came first: the echoes are formatted one after another on a busy
    machine), every sibling ended (the unfinished ones aborted), nothing left running, paused or
    holding KV blocks."""
    limits = ConnectionLimits(write_timeout_s=1.0)
    with (
        serving(demo_assets, tmp_path, limits, engine_process=False) as (server, address, lsn),
        open_not_reading(address, lsn, server, STUCK_ECHO) as sock,
    ):
        wait_engine_freed(server, DEFAULT_MAX_CHOICES)
        received = read_all(sock)  # the connection was cut: its end comes at once
        load = server.engine.load_snapshot()
    assert received.startswith(b"HTTP/1.1 200") and not received.endswith(b"0\r\n\r\n")
    assert load.num_paused == 0


def test_what_a_stalled_echo_stream_holds_is_bounded(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """Two clients stop reading mid-echo (default buffer and pause bounds); once their requests
    are paused, they read again and (no resume allowed) get everything the server held for
    them and an error event: per stream at most its non-streamed answer (bounding its echo
    events) plus ``max_stream_buffer_bytes`` (its other events) plus the transport's 64 KiB."""
    limits = ConnectionLimits(write_timeout_s=600.0)
    with serving(demo_assets, tmp_path, limits, engine_process=False, max_stream_resumes=0) as (
        server,
        address,
        lsn,
    ):
        key = server.sample_keys["acme"]
        host, port = address
        non_streamed = len(
            _post(f"http://{host}:{port}", key, STUCK_ECHO | {"stream": False}).content
        )
        sockets = [open_not_reading(address, lsn, server, STUCK_ECHO) for _ in range(2)]
        wait_until(  # every unfinished sibling of both paused
            server, lambda load: load.num_paused > 0 and load.num_running == load.num_waiting == 0,
            "paused",
        )  # fmt: skip
        assert num_ended(server, "abort") == 0  # paused, not aborted
        received = [read_response(sock) for sock in sockets]
        for sock in sockets:
            sock.close()
    bound = non_streamed + ServeConfig(data_dir=tmp_path).max_stream_buffer_bytes + (64 << 10)
    for body in received:
        assert body.endswith(b"0\r\n\r\n") and b"data: [DONE]" not in body
        assert b'"code":"stream_resumed_too_often"' in body
        assert len(body) <= bound, (len(body), bound)
