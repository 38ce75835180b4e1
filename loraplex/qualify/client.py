"""HTTP access to the deployment under qualification, as an operator and as tenants reach it:
the admin API (httpx) and streamed completions (``bench/sse_client.py``), each answer timed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.sse_client import SseClientError, StreamingPost
from loraplex.errors import LoraplexError


class QualifyError(LoraplexError):
    """The deployment could not be reached or refused what qualification needs to set up;
    ``status``: the HTTP status of the refused admin call, when one was."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Reply:
    """One admin or tenant exchange: status and parsed body."""

    status: int
    body: Any


class Admin:
    """The deployment's admin API (and plain tenant calls) over one httpx client."""

    def __init__(self, url: str, admin_key: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._key = admin_key
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> Reply:
        """``method path`` with ``key`` (default: the admin key) as the bearer token."""
        headers = {"Authorization": f"Bearer {key or self._key}"}
        try:
            reply = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise QualifyError(f"{method} {self.url}{path} failed: {exc}") from None
        try:
            body: Any = reply.json()
        except ValueError:
            body = reply.text
        return Reply(reply.status_code, body)

    def must(self, method: str, path: str, **kwargs: Any) -> Any:
        """An admin call that must succeed; QualifyError quoting the answer otherwise."""
        reply = self.call(method, path, **kwargs)
        if not 200 <= reply.status < 300:
            raise QualifyError(
                f"{method} {path} -> {reply.status}: {str(reply.body)[:300]}", reply.status
            )
        return reply.body

    def upload(self, adapter_dir: Path, fields: dict[str, str]) -> Reply:
        files = {
            "config": ("adapter_config.json", (adapter_dir / "adapter_config.json").read_bytes()),
            "weights": (
                "adapter_model.safetensors",
                (adapter_dir / "adapter_model.safetensors").read_bytes(),
            ),
        }
        return self.call("POST", "/admin/adapters/upload", data=fields, files=files)


@dataclass
class Answer:
    """One streamed completion as the client saw it."""

    status: int = 0  # HTTP status (0: no reply)
    text: str = ""  # the completion's text
    revision: str | None = None  # loraplex.revision the server reported
    tier: str | None = None  # the tier the engine leased the adapter from (L0 warm, else cold)
    tokens: int = 0  # completion tokens
    ttft_s: float | None = None  # send to first token
    tpot_s: float | None = None  # per token after the first
    error: str | None = None  # error event, body or transport failure
    body: str = ""  # a non-200 reply's body (isolation compares them)
    token_times: list[float] = field(default_factory=list)  # monotonic, per text chunk
    retried: list[int] = field(default_factory=list)  # statuses of the attempts retried, in order
    retry_after_s: float | None = None  # the last non-200 reply's Retry-After (None: none sent)

    @property
    def answered(self) -> bool:
        """The deployment answered: a 200 stream with no error event (else refused or failed)."""
        return self.status == 200 and not self.error


# A refusal a client may retry: the server says when (Retry-After), never a client error.
RETRYABLE_STATUSES = frozenset({429, 503})


async def stream_completion(
    url: str, key: str, body: dict[str, Any], timeout_s: float, answer: Answer | None = None,
    *, max_retries: int = 0,
) -> Answer:  # fmt: skip
    """POST /v1/completions with ``stream: true``, filling ``answer`` (a new one when None);
    never raises for what the server answers. A 429 or 503 with Retry-After is sent again after
    the wait it names, at most ``max_retries`` times (each counted in ``answer.retried``), as a
    client would; ``timeout_s`` bounds the whole request, retries and waits included, and TTFT
    counts from the first send."""
    answer = Answer() if answer is None else answer
    start = time.monotonic()
    try:
        await asyncio.wait_for(_attempts(url, key, body, answer, max_retries), timeout_s)
    except TimeoutError:
        answer.error = "timeout"
    except (OSError, SseClientError) as exc:
        answer.error = type(exc).__name__
    if answer.token_times:
        answer.ttft_s = answer.token_times[0] - start
        if len(answer.token_times) > 1:
            span = answer.token_times[-1] - answer.token_times[0]
            answer.tpot_s = span / (len(answer.token_times) - 1)
    return answer


async def _attempts(
    url: str, key: str, body: dict[str, Any], answer: Answer, max_retries: int
) -> None:
    while True:
        await _read(url, key, body, answer)
        retryable = answer.status in RETRYABLE_STATUSES and answer.retry_after_s is not None
        if not retryable or len(answer.retried) >= max_retries:
            return
        answer.retried.append(answer.status)
        await asyncio.sleep(answer.retry_after_s or 0.0)
        answer.status, answer.body, answer.error, answer.retry_after_s = 0, "", None, None


async def _read(url: str, key: str, body: dict[str, Any], answer: Answer) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with StreamingPost(url, "/v1/completions", {**body, "stream": True}, headers) as post:
        reply = post.reply
        if reply is None:
            raise SseClientError("no reply")
        answer.status = reply.status
        if reply.status != 200:
            answer.body = (await post.body()).decode("utf-8", errors="replace")
            answer.error = answer.body[:200]
            answer.retry_after_s = _seconds(reply.headers.get("retry-after"))
            return
        answer.tier = reply.headers.get("x-loraplex-tier")
        async for line in post.lines():
            _consume(line, answer)


def _seconds(header: str | None) -> float | None:
    """A Retry-After of delta-seconds (the form loraplex sends); None when absent or a date."""
    try:
        return None if header is None else max(0.0, float(header))
    except ValueError:
        return None


def _consume(line: str, answer: Answer) -> None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line[len("data: ") :])
    if "error" in chunk:
        answer.error = str(chunk["error"].get("type", "error"))
        return
    info = chunk.get("loraplex") or {}
    answer.revision = info.get("revision") or answer.revision
    answer.tier = info.get("tier") or answer.tier
    for choice in chunk.get("choices") or []:
        if choice.get("text"):
            answer.text += choice["text"]
            answer.token_times.append(time.monotonic())
            answer.tokens += 1
