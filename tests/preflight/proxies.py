"""Front ends, built by the tests, for the items no loraplex setting can break:
ASGI layers an operator might put in front of a server (the server itself is the real one).

- ``LabelDroppingMetrics``: an aggregating relabeler in front of ``/metrics`` that drops the
  ``tier`` and ``cold`` labels and sums the series they told apart.
- ``AdminKeyInjector``: a gateway that adds the admin credential to vLLM's load/unload routes
  (the mistake that gives every caller vLLM's open ``/v1/load_lora_adapter``).
- ``KeyIssueBlocked``: a gateway that refuses key issuance through the admin API.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Scope = dict[str, Any]
DROPPED_LABELS = ("tier", "cold")
INJECTED_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


def drop_labels(text: str, dropped: tuple[str, ...]) -> str:
    """The exposition with ``dropped`` labels removed and the series they split summed."""
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in dropped))
            key = (sample.name, labels)
            sums[key] = sums.get(key, 0.0) + float(sample.value)
    lines = []
    for (name, labels), value in sums.items():
        inner = ",".join(f'{k}="{v}"' for k, v in labels)
        lines.append(f"{name}{{{inner}}} {value}" if inner else f"{name} {value}")
    return "\n".join(lines) + "\n"


class LabelDroppingMetrics:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics":
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    body = drop_labels(b"".join(chunks).decode(), DROPPED_LABELS).encode()
                    headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode()))
                    await send({**start, "headers": headers})
                    await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, capture)


class AdminKeyInjector:
    def __init__(self, app: Any, admin_key: str) -> None:
        self.app = app
        self.header = (b"authorization", f"Bearer {admin_key}".encode())

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in INJECTED_PATHS:
            headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
            scope = {**scope, "headers": [*headers, self.header]}
        await self.app(scope, receive, send)


class KeyIssueBlocked:
    """A gateway that forbids issuing API keys through the admin API (``POST
    /admin/tenants/{tenant}/keys``): the preflight must then take ``--tenant-key``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] == "http"
            and path.startswith("/admin/tenants/")
            and path.endswith("/keys")
        ):
            body = b'{"error": "key issuance is disabled at this gateway"}'
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ]
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
