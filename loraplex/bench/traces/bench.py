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
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx
import uvicorn

from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig
from loraplex.serve.front import Server
from loraplex.tracing.exporter import Tracer
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


def _cpu_s(engine_pid: int | None) -> float:
    """CPU seconds used so far by this process (front, client, sink) and the engine child: less
    sensitive than wall time to other load on a shared machine."""
    total = time.process_time()
    if engine_pid is not None:
        fields = Path(f"/proc/{engine_pid}/stat").read_text().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def _switch(server: Server, tracer: RequestTracing | None) -> None:
    """Turns the front's tracing off (None) or on between rounds.
    NOTE: bench only: ``ServerDeps`` is frozen for the server's own code; the bench swaps the
    one field every route reads per request, while no request is in flight."""
    object.__setattr__(server.deps, "tracing", tracer)


def run_trace_bench(config: TraceBenchConfig) -> dict[str, Any]:
    """Both sides' totals, the ratios and the run's settings (one JSON-able dict)."""
    sink = _Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    serve_config = ServeConfig(
        data_dir=config.data_dir, engine_process=config.engine_process, auto_warm=False,
        trace_endpoint=endpoint, trace_sample_ratio=1.0,
    )  # fmt: skip
    try:
        with ExitStack() as stack:
            server = build_server(serve_config)
            stack.callback(server.close)
            url = stack.enter_context(_serving(server))
            rounds = _measure(server, url, config)
    finally:
        sink.shutdown()
        sink.server_close()
    return {
        "name": "traces_overhead",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        **_summary(rounds),
        "rounds": rounds,
        "exported_bytes": sink.received_bytes,
    }


def _measure(server: Server, url: str, config: TraceBenchConfig) -> list[dict[str, Any]]:
    """The measured rounds, in the order run (ABBA), after one unmeasured warm-up round."""
    tracer = cast(Tracer, server.deps.tracing)
    key = server.sample_keys["acme"]
    asyncio.run(_round(url, key, config))  # warm-up: adapters loaded, not measured
    engine_pid = getattr(server.engine, "pid", None)  # None: the engine runs on a thread
    rounds = []
    for index in range(config.rounds * 2):
        side = ("off", "on", "on", "off")[index % 4]
        _switch(server, tracer if side == "on" else None)
        cpu_before = _cpu_s(engine_pid)
        tokens, failed, seconds = asyncio.run(_round(url, key, config))
        if side == "on":
            # NOTE: the export of this round's spans is charged to it (else the batch
            # processor's thread would export them during the next, maybe untraced, round).
            flush_started = time.perf_counter()
            tracer.flush(60.0)
            seconds += time.perf_counter() - flush_started
        cpu_s = _cpu_s(engine_pid) - cpu_before
        rounds.append(
            {"side": side, "tokens": tokens, "failed": failed, "seconds": seconds, "cpu_s": cpu_s}
        )
    _switch(server, tracer)  # closed as built
    return rounds


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    totals = {
        side: {k: sum(r[k] for r in rounds if r["side"] == side) for k in _SUMMED}
        for side in ("off", "on")
    }
    rate = {s: t["tokens"] / t["seconds"] if t["seconds"] > 0 else None for s, t in totals.items()}
    cpu = {s: t["cpu_s"] * 1000 / t["tokens"] if t["tokens"] else None for s, t in totals.items()}
    return {
        "tokens_per_s_untraced": rate["off"],
        "tokens_per_s_traced": rate["on"],
        "ratio_traced_over_untraced": _ratio(rate["on"], rate["off"]),
        # CPU seconds per 1,000 tokens (this process and the engine child), and untraced over
        # traced: the work left for serving with traces on, whatever else loads the machine
        "cpu_s_per_1k_tokens_untraced": cpu["off"],
        "cpu_s_per_1k_tokens_traced": cpu["on"],
        "cpu_ratio_untraced_over_traced": _ratio(cpu["off"], cpu["on"]),
        "totals": totals,
    }


_SUMMED = ("tokens", "failed", "seconds", "cpu_s")


def _ratio(top: float | None, bottom: float | None) -> float | None:
    """``top / bottom``; None (never 0) when either is missing or ``bottom`` is 0."""
    return None if top is None or not bottom else top / bottom
