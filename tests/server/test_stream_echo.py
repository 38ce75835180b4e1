"""Streamed ``echo`` with logprobs at its largest, at the default stream settings, on the real
server and engine: each choice's first event carries its whole prompt's logprobs (about 290 KB
with ``logprobs: 20`` on a 500-token prompt), larger than ``max_stream_buffer_bytes`` (256 KiB)
and than ``stream_pause_bytes`` (64 KiB). An honest client gets its whole stream, equal to the
non-streamed answer; one that stops reading is still bounded (``server/stream_buffer.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live import Live, live_server

from loraplex.demo.assets import DemoAssets
from loraplex.sampling import MAX_LOGPROBS
from loraplex.server.choices import DEFAULT_MAX_CHOICES

WORDS = ("The acme support team is early and green the cat watches my train " * 60).split()
PROMPT_TOKENS = 500  # of max_model_len 512: room for the generated tokens below
_LOGPROB_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


@pytest.fixture(scope="module")
def live(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Default settings (the stream limits above among them); the engine in-process only to
    start faster: the stream buffer is in the front either way."""
    with live_server(demo_assets, tmp_path_factory.mktemp("stream-echo"), engine_process=False) as server:
        yield server


def _long_prompt(live: Live) -> str:
    prompt = " ".join(WORDS[: PROMPT_TOKENS - 1])  # and BOS
    assert len(live.server.engine.tokenizer.encode(prompt)) == PROMPT_TOKENS
    return prompt


def _post(live: Live, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {live.key('acme')}"}
    reply = httpx.post(f"{live.url}/v1/completions", json=body, headers=headers, timeout=300)
    assert reply.status_code == 200, reply.text[:500]
    return reply


def _streamed_choices(text: str) -> dict[int, dict[str, Any]]:
    """Each choice's text and logprobs, its events' concatenated; fails on an error event."""
    assert text.endswith("data: [DONE]\n\n"), text[-500:]
    choices: dict[int, dict[str, Any]] = {}
    for line in text.split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            got = choices.setdefault(choice["index"], {"text": ""} | {k: [] for k in _LOGPROB_KEYS})
            got["text"] += choice["text"]
            for key in _LOGPROB_KEYS if choice["logprobs"] is not None else ():
                got[key] += choice["logprobs"][key]
    return choices


@pytest.mark.parametrize(
    "shape",
    [{"prompt_copies": DEFAULT_MAX_CHOICES, "max_tokens": 0}, {"n": DEFAULT_MAX_CHOICES, "max_tokens": 8}],
    ids=["16-prompts-echo-only", "n16-generating"],
)
def test_a_streamed_echo_at_the_largest_logprobs_completes_at_defaults(
    live: Live, shape: dict[str, int]
) -> None:
    prompt = _long_prompt(live)
    copies = shape.get("prompt_copies", 1)
    body = {"model": "support", "prompt": [prompt] * copies, "n": shape.get("n", 1),
            "max_tokens": shape["max_tokens"], "echo": True, "logprobs": MAX_LOGPROBS,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    answer = _post(live, body).json()
    streamed = _streamed_choices(_post(live, body | {"stream": True}).text)
    expected = {c["index"]: {"text": c["text"], **c["logprobs"]} for c in answer["choices"]}
    assert sorted(streamed) == list(range(DEFAULT_MAX_CHOICES))
    assert streamed == expected  # the same text, tokens, logprobs, top logprobs and offsets
    assert all(len(c["tokens"]) == PROMPT_TOKENS + shape["max_tokens"] for c in expected.values())
