"""Bounded work per client: credentials before the body, a body capped and timed while it is
read, prompt text capped before tokenizing (off the event loop), bounded connections.

The wire-level tests talk raw HTTP/1.1 to a real uvicorn server on a ``loraplex serve`` socket,
so they can stop sending halfway, as an attacker would, and see when the server answers.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import ADMIN_KEY, Served, make_app_deps
from fakes import CharTokenizer, FakeEngine, on_event_loop
from fastapi.testclient import TestClient
from live import listening
from typer.testing import CliRunner

from loraplex.cli import app as cli_app
from loraplex.cli import serve as serve_cli
from loraplex.serve.config import ServeConfig
from loraplex.serve.front import connection_limits
from loraplex.server.app import create_app
from loraplex.server.deps import ServerConfig
from loraplex.server.listeners import ConnectionLimits
from loraplex.server.stream_buffer import MIN_PAUSE_ROOM_BYTES as ROOM

MAX_BODY = 4096
MAX_UPLOAD = 2048
BODY_TIMEOUT_S = 1.0
HEAD_TIMEOUT_S = 0.5
WAIT_S = 5.0  # far longer than any limit above: a server that has not answered by then never will


@contextmanager
def serving(served: Served, limits: ConnectionLimits) -> Iterator[tuple[str, int]]:
    deps = make_app_deps(
        served, FakeEngine(), max_body_bytes=MAX_BODY, max_upload_bytes=MAX_UPLOAD,
        body_read_timeout_s=BODY_TIMEOUT_S, upload_read_timeout_s=BODY_TIMEOUT_S,
    )  # fmt: skip
    with listening(create_app(deps), limits) as (url, _):
        address = urlsplit(url)
        yield address.hostname or "", address.port or 0
    assert deps.cache is not None
    deps.cache.close()


@pytest.fixture
def address(served: Served) -> Iterator[tuple[str, int]]:
    limits = ConnectionLimits(header_read_timeout_s=HEAD_TIMEOUT_S, max_header_bytes=4096)
    with serving(served, limits) as running:
        yield running


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=WAIT_S)


def _head(path: str, headers: dict[str, str], method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _error(response: bytes) -> dict[str, object]:
    error: dict[str, object] = json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]
    return error


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _tenant(served: Served) -> dict[str, str]:
    return {"Authorization": f"Bearer {served.keys['acme']}", "Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("path", "token"),
    [("/v1/completions", None), ("/v1/completions", "lpx_bad_key"),
     ("/v1/completions", ADMIN_KEY), ("/admin/tenants", "lpx_bad_key")],
)  # fmt: skip
def test_a_bad_credential_is_refused_before_the_body_is_read(
    address: tuple[str, int], path: str, token: str | None
) -> None:
    headers = {"Content-Length": str(MAX_BODY), "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with _connect(address) as sock:
        sock.sendall(_head(path, headers))  # and never the body
        response = _until_closed(sock)
    assert _status(response) == 401
    assert _error(response)["code"] == "invalid_api_key"


def test_a_declared_length_over_the_cap_is_refused_at_once(
    address: tuple[str, int], served: Served
) -> None:
    with _connect(address) as sock:
        sock.sendall(_head("/v1/completions", {**_tenant(served), "Content-Length": "300000000"}))
        response = _until_closed(sock)
    assert _status(response) == 413
    assert _error(response)["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("path", "caps"),
    [
        ("/v1/completions", (MAX_BODY,)),
        # The body's cap, or the upload's own (its parser may read the file part first: which
        # one fires depends on how far the handler got when the bytes passed them)
        ("/admin/adapters/upload", (MAX_UPLOAD + MAX_BODY, MAX_UPLOAD)),
    ],
)
def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_cap(
    address: tuple[str, int], served: Served, path: str, caps: tuple[int, ...]
) -> None:
    if path.startswith("/v1"):
        headers, start = _tenant(served), b"{"
    else:
        form = "multipart/form-data; boundary=b"
        headers = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": form}
        start = b'--b\r\nContent-Disposition: form-data; name="weights"; filename="w"\r\n\r\n'
        # NOTE: the file's first 8 bytes are read as its safetensors header's length: "xxxxxxxx"
        # read as one was refused (422 invalid_adapter) before the cap in one CI run; 1 MiB, the
        # longest a header may declare, leaves the cap to fire first
        start += (1 << 20).to_bytes(8, "little")
    with _connect(address) as sock:
        sock.sendall(_head(path, {**headers, "Transfer-Encoding": "chunked"}) + _chunk(start))
        # Well past the cap, and no final chunk: the server answers while bytes it will never
        # parse are still arriving, and the answer must reach the client all the same (a close
        # with unread bytes makes the kernel reset the connection, which can destroy it).
        for _ in range(max(caps) // 1024 + 64):
            with suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(_chunk(b"x" * 1024))
        response = _until_closed(sock)
    assert _status(response) == 413
    message = str(_error(response)["message"])
    assert any(f"exceeds {cap} bytes" in message for cap in caps), message


def test_a_slow_body_is_cut_at_its_deadline(address: tuple[str, int], served: Served) -> None:
    with _connect(address) as sock:
        sock.sendall(_head("/v1/completions", {**_tenant(served), "Content-Length": "100"}))
        start = time.monotonic()
        for _ in range(3):
            sock.sendall(b"{")  # a byte now and then is not enough
            time.sleep(BODY_TIMEOUT_S / 3)
        response = _until_closed(sock)
    assert _status(response) == 408
    assert time.monotonic() - start >= BODY_TIMEOUT_S * 0.9


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: te"])
def test_a_request_head_not_complete_in_time_is_closed(
    address: tuple[str, int], sent: bytes
) -> None:
    with _connect(address) as sock:
        start = time.monotonic()
        sock.sendall(sent)
        assert _until_closed(sock) == b""
    assert time.monotonic() - start >= HEAD_TIMEOUT_S * 0.9


def test_a_head_sent_a_byte_at_a_time_is_closed_at_its_deadline(
    address: tuple[str, int],
) -> None:
    head = _head("/health", {"X-Padding": "y" * 200}, method="GET")
    num_sent = 0
    with _connect(address) as sock:
        try:  # a byte every 20 ms: the head would take seconds, each byte in time
            for byte in head:
                sock.sendall(bytes([byte]))
                num_sent += 1
                time.sleep(0.02)
        except OSError:  # the server closed the connection while the head was still arriving
            pass
    assert num_sent < len(head)


def test_an_oversized_head_is_refused(address: tuple[str, int]) -> None:
    with _connect(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Padding: " + b"y" * 8192)  # and no end yet
        assert _status(_until_closed(sock)) == 400


@pytest.mark.parametrize("num_bytes", [4096 - 200, 3 * 4096])  # under and over the cap
def test_a_head_sent_whole_is_held_to_the_cap(address: tuple[str, int], num_bytes: int) -> None:
    """h11 measures only a head still waiting for its end: one that arrived in a single read
    (up to ~100 KiB here) used to pass ``max_header_bytes`` unchecked."""
    head = _head("/health", {"X-Padding": "y" * num_bytes, "Connection": "close"}, "GET")
    with _connect(address) as sock:
        sock.sendall(head)
        response = _until_closed(sock)
    assert _status(response) == (200 if len(head) <= 4096 else 400), response[:200]


def test_a_connection_beyond_the_cap_takes_the_place_of_the_oldest_idle_one(
    served: Served,
) -> None:
    limits = ConnectionLimits(max_connections=2, max_unauthenticated_connections=2)
    with serving(served, limits) as address:
        first, second = _connect(address), _connect(address)
        time.sleep(0.2)  # the server has accepted both
        with _connect(address) as third:
            third.sendall(_head("/health", {"Connection": "close"}, method="GET"))
            assert _status(_until_closed(third)) == 200
        with suppress(ConnectionResetError):  # closed for the newcomer, maybe reset
            assert first.recv(1) == b""
        second.sendall(_head("/health", {"Connection": "close"}, method="GET"))
        assert _status(_until_closed(second)) == 200
        first.close()
        second.close()


def test_requests_within_the_limits_are_served(address: tuple[str, int], served: Served) -> None:
    body = json.dumps({"model": "support", "prompt": "hi", "stream": True}).encode()
    headers = {**_tenant(served), "Content-Length": str(len(body)), "Connection": "close"}
    with _connect(address) as sock:
        sock.sendall(_head("/v1/completions", headers) + body)
        response = _until_closed(sock)
    assert _status(response) == 200 and b"data: [DONE]" in response


class LoopCheckingTokenizer(CharTokenizer):
    """Records, per call, whether an event loop runs on the calling thread."""

    def __init__(self) -> None:
        self.on_loop: list[bool] = []

    def encode(self, text: str) -> list[int]:
        self.on_loop.append(on_event_loop())
        return super().encode(text)

    def token_text(self, token_id: int) -> str:
        self.on_loop.append(on_event_loop())
        return super().token_text(token_id)

    def decode(self, token_ids: list[int]) -> str:
        self.on_loop.append(on_event_loop())
        return super().decode(token_ids)


def test_prompts_are_tokenized_off_the_event_loop(served: Served) -> None:
    tokenizer = LoopCheckingTokenizer()
    deps = make_app_deps(served, FakeEngine(char_tokenizer=tokenizer))
    auth = {"Authorization": f"Bearer {served.keys['acme']}"}
    with TestClient(create_app(deps)) as client:
        for path, body in [
            ("/v1/completions", {"model": "support", "prompt": "hi"}),
            ("/v1/chat/completions", {"model": "support", "messages": [{"role": "user",
                                                                         "content": "hi"}]}),
        ]:  # fmt: skip
            assert client.post(path, json=body, headers=auth).status_code == 200
    assert tokenizer.on_loop and not any(tokenizer.on_loop)
    assert deps.cache is not None
    deps.cache.close()


def test_a_large_answer_is_formatted_off_the_event_loop(served: Served) -> None:
    """Every token's string and its top logprobs, and the JSON dump of the answer: 16 echoed
    prompts of 480 tokens with ``logprobs: 20`` (a 4.6 MB answer on the demo model) held the
    event loop, so every other tenant's request and /health waited (docs/operations.md)."""
    tokenizer = LoopCheckingTokenizer()
    deps = make_app_deps(served, FakeEngine(char_tokenizer=tokenizer))
    auth = {"Authorization": f"Bearer {served.keys['acme']}"}
    chat = {"model": "support", "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
            "top_logprobs": 3, "max_tokens": 3}  # fmt: skip
    with TestClient(create_app(deps)) as client:
        for path, body in [
            ("/v1/completions", {"model": "support", "prompt": ["ab", "cd"], "echo": True,
                                 "logprobs": 3, "max_tokens": 3}),
            ("/v1/completions", {"model": "support", "prompt": [[5, 6, 7]], "echo": True,
                                 "max_tokens": 2}),
            ("/v1/chat/completions", chat),
        ]:  # fmt: skip
            reply = client.post(path, json=body, headers=auth)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["logprobs"] or "echo" in body
    assert len(tokenizer.on_loop) > 10 and not any(tokenizer.on_loop)
    assert deps.cache is not None
    deps.cache.close()


def test_prompt_text_over_the_cap_is_refused_before_tokenizing(served: Served) -> None:
    tokenizer = LoopCheckingTokenizer()
    engine = FakeEngine(char_tokenizer=tokenizer)
    deps = make_app_deps(served, engine, max_prompt_chars=10)
    auth = {"Authorization": f"Bearer {served.keys['acme']}"}
    long_chat = [{"role": "system", "content": "x" * 6}, {"role": "user", "content": "y" * 5}]
    with TestClient(create_app(deps)) as client:
        for path, body, param in [
            ("/v1/completions", {"model": "support", "prompt": "z" * 11}, "prompt"),
            ("/v1/completions", {"model": "support", "prompt": ["z" * 11]}, "prompt"),
            ("/v1/chat/completions", {"model": "support", "messages": long_chat}, "messages"),
        ]:
            response = client.post(path, json=body, headers=auth)
            assert response.status_code == 400 and response.json()["error"]["param"] == param
        assert tokenizer.on_loop == [] and engine.requests == []
        fits = {"model": "support", "prompt": "z" * 10}
        assert client.post("/v1/completions", json=fits, headers=auth).status_code == 200
        token_ids = {"model": "support", "prompt": [5] * 50}  # ids are capped in tokens instead
        assert client.post("/v1/completions", json=token_ids, headers=auth).status_code == 200
    assert deps.cache is not None
    deps.cache.close()


def test_limit_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_body_bytes 0 is invalid"):
        ServerConfig(base_model_name="m", admin_key=ADMIN_KEY, max_body_bytes=0)
    with pytest.raises(ValueError, match="body_read_timeout_s 0 is invalid"):
        ServerConfig(base_model_name="m", admin_key=ADMIN_KEY, body_read_timeout_s=0)
    with pytest.raises(ValueError, match="header_read_timeout_s 0 is invalid"):
        ConnectionLimits(header_read_timeout_s=0)
    with pytest.raises(ValueError, match="max_connections 0 is invalid"):
        ServeConfig(data_dir=tmp_path, max_connections=0)
    with pytest.raises(ValueError, match="max_prompt_chars 0 is invalid"):
        ServeConfig(data_dir=tmp_path, max_prompt_chars=0)
    for key, value, expected in (
        ("max_header_count", 0, ">= 1"),
        ("max_unsent_response_bytes", 0, ">= 1"),
        ("min_send_bytes_per_s", -1, ">= 0"),
        ("ipv6_address_prefix", 0, "1 to 128"),
        ("ipv6_address_prefix", 129, "1 to 128"),
    ):
        with pytest.raises(ValueError, match=f"{key} {value} is invalid; expected {expected}"):
            ServeConfig(data_dir=tmp_path, **{key: value})
    assert ServeConfig(data_dir=tmp_path, max_model_len=100).prompt_chars() == 6400
    assert ServeConfig(data_dir=tmp_path, max_prompt_chars=7).prompt_chars() == 7


def test_serve_flags_reach_the_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ServeConfig] = []
    monkeypatch.setattr(serve_cli, "_run", seen.append)
    flags = ["--max-body-bytes", "11", "--max-upload-bytes", "12", "--max-prompt-chars", "13",
             "--body-read-timeout-s", "14", "--upload-read-timeout-s", "15",
             "--header-read-timeout-s", "16", "--keep-alive-timeout-s", "17",
             "--max-connections", "18", "--max-header-bytes", "19",
             "--max-unauthenticated-connections", "5", "--max-connections-per-address", "6",
             "--accepts-per-s-per-address", "7", "--write-timeout-s", "8",
             "--max-stream-buffer-bytes", str(ROOM + 9), "--stream-pause-bytes", "4",
             "--max-stream-resumes", "3", "--max-header-count", "21",
             "--min-send-bytes-per-s", "22", "--max-unsent-response-bytes", "23",
             "--ipv6-address-prefix", "48"]  # fmt: skip
    result = CliRunner().invoke(cli_app, ["serve", "--data-dir", str(tmp_path), *flags])
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert (settings.max_body_bytes, settings.max_upload_bytes, settings.max_prompt_chars) == (
        11, 12, 13
    )  # fmt: skip
    assert (settings.body_read_timeout_s, settings.upload_read_timeout_s) == (14, 15)
    assert connection_limits(settings) == ConnectionLimits(
        16, 17, 18, 19, max_unauthenticated_connections=5, max_connections_per_address=6,
        accepts_per_s_per_address=7, write_timeout_s=8, max_header_count=21,
        min_send_bytes_per_s=22, max_unsent_response_bytes=23, ipv6_address_prefix=48,
    )  # fmt: skip
    assert settings.max_stream_buffer_bytes == ROOM + 9
    assert (settings.stream_pause_bytes, settings.max_stream_resumes) == (4, 3)
