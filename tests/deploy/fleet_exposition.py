"""A fleet ingress's ``/metrics`` family without Ray, for the dashboard's fleet panels and the
fleet alerts: the ingress's real ``FleetCollector`` over a real ``FleetLink``, whose board (a Ray
Serve deployment in a fleet) is ``Board``: the live ``EngineReplica.status()`` of replicas
wrapping one in-thread engine. Routing decisions are made by the real ``Router`` and recorded in
``ROUTING_LOG`` exactly as ``fleet/ray_router.py`` does; exposed over HTTP for Prometheus."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from loraplex.clock import MonotonicClock
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.transport.messages import CacheCommand
from loraplex.fleet import routing
from loraplex.fleet.board import STALE_AFTER_S, BoardEntry
from loraplex.fleet.link import FleetLink
from loraplex.fleet.replica import EngineReplica
from loraplex.fleet.state import FleetCollector
from loraplex.router.router import Router
from loraplex.sampling import SamplingParams


@dataclass
class Board:
    """``ReplicaCalls`` over live replicas; ``stale`` ones report an old status (out of
    rotation), and a replica removed from ``replicas`` has left the board."""

    replicas: dict[str, EngineReplica]
    stale: set[str] = field(default_factory=set)

    async def board_entries(self) -> list[BoardEntry]:
        return [
            BoardEntry(rid, replica.status(), STALE_AFTER_S + 1 if rid in self.stale else 0.0)
            for rid, replica in list(self.replicas.items())
        ]

    async def cache_call(self, replica_id: str, command: CacheCommand) -> Any:
        raise NotImplementedError("the fleet exposition only reads the board")


def route(board: Board, requests: list[EngineRequest]) -> None:
    """Routes each request among the board's replicas as the fleet's router does, recording the
    reason of each decision in ``ROUTING_LOG``."""
    router = Router(clock=MonotonicClock(), rng=random.Random(0))
    for request in requests:
        reports = {rid: r.routing_report() for rid, r in board.replicas.items()}
        decision = router.choose(routing.route_request_of([request]), reports)
        routing.ROUTING_LOG.record(decision.reason.value)


def engine_request(request_id: str, tenant: str) -> EngineRequest:
    return EngineRequest(request_id, tenant, None, (4, 5, 6), SamplingParams(max_tokens=2))


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


@contextmanager
def exposed(board: Board) -> Iterator[str]:
    """The board's fleet family at ``http://<yielded host:port>/metrics`` until the block ends."""
    link = FleetLink(board, poll_interval_s=0.2)
    registry = CollectorRegistry()
    registry.register(FleetCollector(link, lambda: 0))
    server = make_server("127.0.0.1", 0, make_wsgi_app(registry), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert link.wait_polled(30), "the fleet link never read the board"
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        link.close()
