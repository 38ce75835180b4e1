"""The default body cap, derived from what a valid request can hold (``ServeConfig.body_bytes``).

A body past it holds a prompt the server would refuse anyway: it is refused from its
``Content-Length`` with a 413 naming the limit, before a byte of it is read or parsed (issue 25:
16 prompts of 65,536 token ids, 4 MB of JSON under the old 8 MiB cap, were read and parsed on
the event loop on their way to a 400, and cost the other tenants' TTFT).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from live import live_server

from loraplex.demo.assets import DemoAssets
from loraplex.sampling import MAX_LOGIT_BIAS_ENTRIES, MAX_STOP_TOKEN_IDS
from loraplex.serve.config import ServeConfig
from loraplex.server.protocol import MAX_BATCH_PROMPTS, MAX_STOP_CHARS, MAX_STOP_STRINGS

WAIT_S = 30.0  # far longer than the server needs to answer a head


def test_the_default_cap_follows_the_prompt_bounds(tmp_path: Path) -> None:
    assert ServeConfig(data_dir=tmp_path).body_bytes() == 3 << 20  # max_model_len 512
    assert ServeConfig(data_dir=tmp_path, max_model_len=100).body_bytes() == (
        4 * 16 * 64 * 100 + (1 << 20)
    )
    assert ServeConfig(data_dir=tmp_path, max_prompt_chars=1000).body_bytes() == (
        4 * 16 * 1000 + (1 << 20)
    )
    assert ServeConfig(data_dir=tmp_path, max_body_bytes=12345).body_bytes() == 12345
    with pytest.raises(ValueError, match="max_body_bytes 0 is invalid"):
        ServeConfig(data_dir=tmp_path, max_body_bytes=0)


@pytest.mark.parametrize("max_model_len", [16, 512, 4096])
def test_the_largest_valid_completions_body_fits_the_default_cap(
    tmp_path: Path, max_model_len: int
) -> None:
    config = ServeConfig(data_dir=tmp_path, max_model_len=max_model_len)
    widest = "\U0001f600"  # 4 bytes of UTF-8, one character
    body = {
        "model": "m" * 512,
        "prompt": [widest * config.prompt_chars()] * MAX_BATCH_PROMPTS,
        "stop": [widest * MAX_STOP_CHARS] * MAX_STOP_STRINGS,
        "logit_bias": {str(100_000 + i): -100.0 for i in range(MAX_LOGIT_BIAS_ENTRIES)},
        "stop_token_ids": [100_000 + i for i in range(MAX_STOP_TOKEN_IDS)],
        "user": widest * 256,
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "logprobs": 20,
        "echo": True,
        "n": 16,
        "best_of": 16,
        "seed": 2**63 - 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    encoded = json.dumps(body, ensure_ascii=False).encode("utf-8")
    ids = json.dumps({"prompt": [[99_999] * (max_model_len - 1)] * MAX_BATCH_PROMPTS}).encode()
    assert len(encoded) <= config.body_bytes()
    assert len(ids) <= config.body_bytes()


def _answer(url: str, key: str, content_length: int, body: bytes = b"") -> tuple[int, Any]:
    """Sends the head of a completions request declaring ``content_length``, then ``body``;
    the answer's status and error."""
    parts = urlsplit(url)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {content_length}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=WAIT_S) as sock:
        sock.sendall(head)
        sock.sendall(body)
        received = b""
        while chunk := sock.recv(65536):  # the server closes after a 413
            received += chunk
    head_part, body = received.split(b"\r\n\r\n", 1)
    return int(head_part.split(b" ", 2)[1]), json.loads(body)["error"]


def test_a_token_id_batch_past_the_default_cap_is_refused_before_its_body(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    with live_server(demo_assets, tmp_path, engine_process=False) as live:
        cap = ServeConfig(data_dir=tmp_path).body_bytes()
        key = live.key(sorted(live.server.sample_keys)[0])
        # 16 prompts of 65,536 ids, as in issue 25: about 4 MB, under the old 8 MiB cap
        status, error = _answer(live.url, key, 16 * 65_536 * 4)
        assert status == 413
        assert error["code"] == "request_too_large"
        assert error["message"] == f"request body exceeds {cap} bytes (max_body_bytes)"
        fields = b'{"model": "no-such-adapter", "prompt": "hi"}'
        padded = fields + b" " * (cap - len(fields))  # at the cap: read, parsed, answered
        status, error = _answer(live.url, key, cap, padded)
        assert (status, error["code"]) == (404, "model_not_found")
