"""What reaches a stream's buffer after its request was paused (``server/stream_buffer.py``)
counts against ``max_stream_buffer_bytes`` like anything else: the pause is a command the
engine takes between steps (``EngineCore.pause``), so the step in flight, and whatever the
siblings' pumps hold, still arrives. Could that cut an honest stream short (``stream_not_read``
for a client that reads again)? Only if it passed the room between ``stream_pause_bytes`` and
the buffer (192 KiB at the defaults). Measured on the real engine with the heaviest per-step
output a request may ask for: 16 choices running at once, each token with 20 top logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from stuck_client import open_not_reading, read_response, serving, wait_until

from loraplex.demo.assets import DemoAssets
from loraplex.serve.config import ServeConfig
from loraplex.server import stream_buffer
from loraplex.server.listeners import ConnectionLimits

NUM_CHOICES = 16  # the most one request fans out into (choices.DEFAULT_MAX_CHOICES)


@dataclass
class Watch:
    """The buffer's counted bytes at each pause, and how far past it each later put took it."""

    at_pause: list[int] = field(default_factory=list)
    past_pause: list[int] = field(default_factory=list)


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Watch:
    seen = Watch()
    real = stream_buffer._Flow.after_put

    async def after_put(self: stream_buffer._Flow, num_bytes: int) -> None:
        if self.paused:
            seen.past_pause.append(num_bytes - seen.at_pause[-1])
        was_paused = self.paused
        await real(self, num_bytes)
        if self.paused and not was_paused:
            seen.at_pause.append(num_bytes)

    monkeypatch.setattr(stream_buffer._Flow, "after_put", after_put)
    return seen


_COMMON = {"model": "support", "stream": True, "n": NUM_CHOICES, "max_tokens": 60,
           "ignore_eos": True}  # fmt: skip
# Completions' top logprobs are ``{"token": logprob}``; chat's carry each token's bytes too
_COMPLETIONS = {**_COMMON, "prompt": "The acme support team", "logprobs": 20}
_CHAT = {**_COMMON, "messages": [{"role": "user", "content": "The acme support team"}],
         "logprobs": True, "top_logprobs": 20}  # fmt: skip


@pytest.mark.parametrize(
    ("engine_process", "path", "request_body"),
    [(False, "/v1/completions", _COMPLETIONS), (True, "/v1/chat/completions", _CHAT)],
    ids=["thread-completions", "process-chat"],
)
def test_what_arrives_after_a_pause_stays_within_the_buffer(
    demo_assets: DemoAssets,
    tmp_path: Path,
    engine_process: bool,
    path: str,
    request_body: dict[str, object],
    watch: Watch,
) -> None:
    """At the default bounds the stream is paused once its client stops reading, what
    arrives after the pause stays well inside the room left, and the client reading again
    gets the whole stream (it is resumed)."""
    defaults = ServeConfig(data_dir=tmp_path)
    room = defaults.max_stream_buffer_bytes - defaults.stream_pause_bytes
    limits = ConnectionLimits(write_timeout_s=600.0)
    config = {"engine_process": engine_process, "max_num_seqs": NUM_CHOICES}
    with (
        serving(demo_assets, tmp_path, limits, **config) as (server, address, listener),
        open_not_reading(address, listener, server, request_body, path) as sock,
    ):
        wait_until(server, lambda load: load.num_paused > 0, "paused")
        wait_until(server, lambda load: load.num_running == 0, "done running")
        received = read_response(sock)  # it reads again: resumed to the end
    past = max(watch.past_pause, default=0)
    print(f"{path}: bytes at each pause {watch.at_pause}; past a pause at most {past}")
    assert watch.at_pause and min(watch.at_pause) >= defaults.stream_pause_bytes
    assert past < room, watch  # else the buffer overflowed: stream_not_read
    assert b"data: [DONE]" in received and b'"error"' not in received
