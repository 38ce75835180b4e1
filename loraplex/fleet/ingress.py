"""The fleet's ingress: ``loraplex serve``'s HTTP side (``serve.front.build_front``: the same
routes, auth, resolution, tokenization, limits and release controller) over the engine
replicas instead of a local engine.

``RayCalls`` is the only code here that speaks Ray: streams and cache calls through the engine
deployment's handle (so ``LoraplexRequestRouter`` routes them), the board through its handle.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponse

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.engine.protocol import EngineRequest
from loraplex.engine.transport.messages import CacheCommand
from loraplex.engine.transport.packed_errors import unpack_error
from loraplex.fleet import routing
from loraplex.fleet.board import BoardEntry
from loraplex.fleet.cache import FleetCache, FleetMergeHolds
from loraplex.fleet.engine_client import FleetEngineClient, ReplicaStream
from loraplex.fleet.link import CALL_TIMEOUT_S, FleetLink
from loraplex.fleet.release_env import FleetReleaseEnv
from loraplex.fleet.settings import FleetSettings
from loraplex.fleet.standing_restore import pin_owners, read_restored
from loraplex.fleet.state import FleetCollector, FleetStateView
from loraplex.fleet.wire import Failed, RouteHint
from loraplex.model.tokenizer import TextTokenizer
from loraplex.registry import open_registry
from loraplex.release.traffic import ReleaseTraffic
from loraplex.serve.bootstrap import admin_key
from loraplex.serve.engine_settings import registry_config
from loraplex.serve.front import Front, Server, build_front
from loraplex.server.pin_owners import OwnedPins

BOARD_TIMEOUT_S = 10.0  # one read of the board
LOST_REPLICA_ERRORS = (RayActorError, ActorDiedError, ActorUnavailableError)
T = TypeVar("T")


def outside_request(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` in an empty context, so a handle call made while serving an
    HTTP request gets its own Ray Serve request identity.

    NOTE: Ray Serve takes a handle call's internal request id from the calling request's
    context, and its router indexes pending calls by that id. Several calls sharing one id at
    once (a snapshot or an eviction on every replica, the choices of an ``n > 1`` completion)
    left all but the first unmatched: their routing tasks spun on the router's loop, which
    every handle in the process shares, and routing stalled for everyone until the calls
    timed out.
    """
    return contextvars.Context().run(call, *args, **kwargs)


def is_replica_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the replica is gone (died, unreachable), not the request's fault."""
    return isinstance(exc, LOST_REPLICA_ERRORS)


class RayCalls:
    """The engine deployment and the board, through their Ray Serve handles."""

    def __init__(self, engine: DeploymentHandle, board: DeploymentHandle) -> None:
        self._engine = engine
        self._streams = engine.options(stream=True)
        self._board = board

    def open_stream(self, request: EngineRequest, hint: RouteHint) -> ReplicaStream:
        stream: ReplicaStream = outside_request(self._streams.generate.remote, request, hint=hint)
        return stream

    async def board_entries(self) -> list[BoardEntry]:
        entries: list[BoardEntry] = await _awaited(
            outside_request(self._board.entries.remote), BOARD_TIMEOUT_S
        )
        return entries

    async def cache_call(self, replica_id: str, command: CacheCommand) -> Any:
        hint = RouteHint(target=replica_id)
        response = outside_request(self._engine.cache_call.remote, command, hint=hint)
        reply = await _awaited(response, CALL_TIMEOUT_S)
        if isinstance(reply, Failed):
            raise unpack_error(reply.error)
        return reply


async def _awaited(response: DeploymentResponse, timeout_s: float) -> Any:
    """``response``'s result within ``timeout_s``; cancelled (on the replica too) when the
    caller gives up or is cancelled."""
    try:
        return await asyncio.wait_for(response, timeout_s)
    except (asyncio.CancelledError, TimeoutError):
        response.cancel()
        raise


def build_ingress(
    settings: FleetSettings, engine: DeploymentHandle, board: DeploymentHandle
) -> Server:
    """The ingress's server: registry, fleet engine client and cache, app, release controller."""
    config = settings.serve
    model_dir = settings.model_dir
    base = BaseModelSpec.from_dir(model_dir)
    registry = open_registry(registry_config(config), base=base)
    try:
        # NOTE: the last ingress's standing state died with it (Ray Serve restarts a crashed
        # ingress): this one starts from the durable records (``fleet/standing_restore.py``)
        restored = read_restored(registry, base.digest, time.time())
    except BaseException:
        registry.close()
        raise
    calls = RayCalls(engine, board)
    link = FleetLink(calls)
    try:
        client = FleetEngineClient(
            calls.open_stream, is_replica_lost, link, TextTokenizer(model_dir)
        )
        cache = FleetCache(link, restored)
        admin = config.admin_key or admin_key(config.data_dir)
        holds = FleetMergeHolds(link)
        routing.TOPOLOGY_ASKS.send = holds.dedicate  # this process's request router asks
        front = Front(client, cache, cache.update_tenant_settings, admin, {}, holds)

        def release_env(pins: OwnedPins, traffic: ReleaseTraffic) -> FleetReleaseEnv:
            # NOTE: here, where the server's ``OwnedPins`` is handed out: the adopted pins get
            # their owners, so a release's end never lifts an operator's pin it found
            cache.on_adopted(lambda adopted: pins.adopt(pin_owners(adopted, restored)))
            return FleetReleaseEnv(pins, client, traffic, link)

        server = build_front(
            config,
            model_dir,
            base,
            registry,
            front,
            release_env=release_env,
            fleet=FleetStateView(link),
            operator_pins=restored.operator_pins,  # standing from the start (``FleetCache``)
        )
    except BaseException:
        link.close()
        registry.close()
        raise
    server.deps.metrics.registry.register(FleetCollector(link, lambda: client.num_retries))
    return server
