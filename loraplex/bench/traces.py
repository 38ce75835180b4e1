"""``loraplex bench traces``: what request traces cost in throughput.

One server (``loraplex serve``'s assembly, its engine in its own process by default) is built
with tracing every request (``trace_sample_ratio`` 1, exporting over OTLP/HTTP to a local sink
that reads and discards each POST); between rounds the bench switches its front's tracer off and
on (``deps.tracing`` None is exactly a server without ``trace_endpoint``: no trace is begun and
the engine gets no ``traceparent``). One server, not two, so that both sides share the same
engine process, caches and cores. Rounds alternate (ABBA order, so drift and warm-up fall on
both sides alike); each round sends the same requests (adapters and the base model, fixed
output length with ``ignore_eos``) at a fixed concurrency. Throughput is generated
tokens over wall-clock seconds on one clock; a failed request counts zero tokens and is
counted. The ratio is traced over untraced; null when the untraced side produced nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from loraplex.serve.assembly import Server, build_server
from loraplex.serve.config import ServeConfig
from loraplex.tracing.record import RequestTracing

MODELS = ("support", "loraplex-demo-small")  # an adapter alias (acme's) and the base model


@dataclass(frozen=True)
class TraceBenchConfig:
    data_dir: Path  # the server's state (the demo set is generated there)
    rounds: int = 10  # per side
    requests_per_round: int = 32
    concurrency: int = 8
    max_tokens: int = 32  # generated per request (ignore_eos: always this many)
    engine_process: bool = True  # the servers' engine in its own process (the default)

    def __post_init__(self) -> None:
        for name in ("rounds", "requests_per_round", "concurrency", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")


class _Sink(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that reads each export and answers 200 (counts bytes only)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SinkHandler)
        self.received_bytes = 0
        self.lock = threading.Lock()


class _SinkHandler(BaseHTTPRequestHandler):
    server: _Sink

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        size = len(self.rfile.read(length))
        with self.server.lock:
            self.server.received_bytes += size
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextmanager
def _serving(server: Server) -> Iterator[str]:
    config = uvicorn.Config(server.app, host="127.0.0.1", port=0, log_level="warning")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        if not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = runner.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        runner.should_exit = True
        thread.join(timeout=30)


async def _round(url: str, key: str, config: TraceBenchConfig) -> tuple[int, int, float]:
    """(tokens generated, requests failed, seconds) of one round."""
    gate = asyncio.Semaphore(config.concurrency)
    headers = {"Authorization": f"Bearer {key}"}

    async def one(client: httpx.AsyncClient, index: int) -> int | None:
        body = {
            "model": MODELS[index % len(MODELS)],
            "prompt": f"The acme support team, request {index}",
            "max_tokens": config.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        async with gate:
            reply = await client.post(f"{url}/v1/completions", json=body, headers=headers)
        if reply.status_code != 200:
            return None
        tokens: int = reply.json()["usage"]["completion_tokens"]
        return tokens

    async with httpx.AsyncClient(timeout=300) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(one(client, i) for i in range(config.requests_per_round)))
        seconds = time.perf_counter() - started
    return sum(r or 0 for r in results), sum(r is None for r in results), seconds


def _switch(server: Server, tracer: RequestTracing | None) -> None:
    """Turns the front's tracing off (None) or on between rounds.
    NOTE: bench only: ``ServerDeps`` is frozen for the server's own code; the bench swaps the
    one field every route reads per request, while no request is in flight."""
    object.__setattr__(server.deps, "tracing", tracer)


def run_trace_bench(config: TraceBenchConfig) -> dict[str, Any]:
    """Both sides' totals, the ratio and the run's settings (one JSON-able dict)."""
    sink = _Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    serve_config = ServeConfig(
        data_dir=config.data_dir, engine_process=config.engine_process, auto_warm=False,
        trace_endpoint=endpoint, trace_sample_ratio=1.0,
    )  # fmt: skip
    totals = {side: {"tokens": 0, "failed": 0, "seconds": 0.0} for side in ("off", "on")}
    rounds: list[dict[str, Any]] = []  # in the order run
    with ExitStack() as stack:
        server = build_server(serve_config)
        stack.callback(server.close)
        tracer = server.deps.tracing
        url = stack.enter_context(_serving(server))
        key = server.sample_keys["acme"]
        asyncio.run(_round(url, key, config))  # warm-up: adapters loaded, not measured
        for index in range(config.rounds * 2):
            side = ("off", "on", "on", "off")[index % 4]
            _switch(server, tracer if side == "on" else None)
            tokens, failed, seconds = asyncio.run(_round(url, key, config))
            rounds.append({"side": side, "tokens": tokens, "failed": failed, "seconds": seconds})
            totals[side]["tokens"] += tokens
            totals[side]["failed"] += failed
            totals[side]["seconds"] += seconds
        _switch(server, tracer)  # closed as built
    sink.shutdown()
    sink.server_close()
    rate = {
        side: (t["tokens"] / t["seconds"] if t["seconds"] > 0 else None)
        for side, t in totals.items()
    }
    off_rate, on_rate = rate["off"], rate["on"]
    ratio = None if not off_rate or on_rate is None else on_rate / off_rate
    return {
        "name": "traces_overhead",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "tokens_per_s_untraced": off_rate,
        "tokens_per_s_traced": on_rate,
        "ratio_traced_over_untraced": ratio,
        "totals": totals,
        "rounds": rounds,
        "exported_bytes": sink.received_bytes,
    }
