"""Preflight item 5's stream: a refused stream says its status and ``Retry-After`` (it said
only "stream did not complete" when the server answered 429), an error event its message."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from loraplex.preflight import observe
from loraplex.preflight.client import Answer
from loraplex.preflight.load import Target

TARGET = Target("acme/support", "lpx_key", {"acme/support@r1": "ab" * 32})
BUSY = {"error": {"message": "tenant acme's queue is full", "type": "rate_limit_error"}}


class _Deployment:
    """What ``in_use_probe`` asks of a deployment: its URL, timeout and the admin API."""

    url = "http://preflight.test"
    timeout_s = 5.0

    def __init__(self) -> None:
        self.asked: list[str] = []

    def admin(self, method: str, path: str, body: Any = None, params: Any = None) -> Answer:
        self.asked.append(f"{method} {path}")
        return Answer(method, path, 200, {"evicted": False, "entries": []})

    def admin_json(self, path: str, params: Any = None) -> Any:
        return self.admin("GET", path).body


def _serve(monkeypatch: pytest.MonkeyPatch, reply: httpx.Response) -> None:
    """Every HTTP client ``observe`` opens gets ``reply`` to its stream."""
    real = httpx.Client

    def client(**kw: Any) -> httpx.Client:
        return real(transport=httpx.MockTransport(lambda request: reply), **kw)

    monkeypatch.setattr(observe.httpx, "Client", client)


def test_a_refused_stream_names_its_status_and_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _serve(monkeypatch, httpx.Response(429, json=BUSY, headers={"Retry-After": "2"}))
    probe = observe.in_use_probe(_Deployment(), TARGET)  # type: ignore[arg-type]
    assert (probe.stream_status, probe.stream_complete) == (429, False)
    assert probe.note == "stream refused: status 429, Retry-After 2 s: tenant acme's queue is full"


def test_an_error_event_is_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    events = 'data: {"choices":[{"text":"a"}]}\n\ndata: {"error":{"message":"adapter gone"}}\n\n'
    _serve(monkeypatch, httpx.Response(200, text=events))
    deployment = _Deployment()
    probe = observe.in_use_probe(deployment, TARGET)  # type: ignore[arg-type]
    assert probe.evict_answer is not None and not probe.stream_complete
    assert probe.note == "stream ended with an error event: adapter gone"
