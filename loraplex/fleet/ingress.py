"""The fleet's ingress: ``loraplex serve``'s HTTP side (``serve.assembly.build_front``: the same
routes, auth, resolution, tokenization, limits and release controller) over the engine
replicas instead of a local engine.

``RayCalls`` is the only code here that speaks Ray: streams and cache calls through the engine
deployment's handle (so ``LoraplexRequestRouter`` routes them), the board through its handle.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.engine.messages import CacheCommand
from loraplex.engine.process_child import unpack_error
from loraplex.engine.protocol import EngineRequest
from loraplex.fleet.board import BoardEntry
from loraplex.fleet.cache import FleetCache
from loraplex.fleet.engine_client import FleetEngineClient, ReplicaStream
from loraplex.fleet.link import CALL_TIMEOUT_S, FleetLink
from loraplex.fleet.release_env import FleetReleaseEnv
from loraplex.fleet.settings import FleetSettings
from loraplex.fleet.state import FleetCollector, FleetStateView
from loraplex.fleet.wire import Failed, RouteHint
from loraplex.model.tokenizer import TextTokenizer
from loraplex.registry import open_registry
from loraplex.serve.assembly import Front, Server, build_front
from loraplex.serve.bootstrap import admin_key
from loraplex.serve.engine_side import registry_config
from loraplex.server.pin_owners import OwnedPins
from loraplex.server.release_traffic import ReleaseTraffic

BOARD_TIMEOUT_S = 10.0  # one read of the board
LOST_REPLICA_ERRORS = (RayActorError, ActorDiedError, ActorUnavailableError)


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
        stream: ReplicaStream = self._streams.generate.remote(request, hint=hint)
        return stream

    # NOTE: these two run Ray's blocking API on a worker thread. Awaiting a DeploymentResponse
    # on the link's own loop, while another thread waited for that call's result, stalled the
    # ingress's routing (an admin eviction hung for its whole timeout and every request queued
    # behind it); the blocking API from a plain thread is what the engine replicas' board
    # pushes use, and it does not.
    async def board_entries(self) -> list[BoardEntry]:
        return await asyncio.to_thread(self._board_entries)

    async def cache_call(self, replica_id: str, command: CacheCommand) -> Any:
        reply = await asyncio.to_thread(self._cache_call, replica_id, command)
        if isinstance(reply, Failed):
            raise unpack_error(reply.error)
        return reply

    def _board_entries(self) -> list[BoardEntry]:
        entries: list[BoardEntry] = self._board.entries.remote().result(timeout_s=BOARD_TIMEOUT_S)
        return entries

    def _cache_call(self, replica_id: str, command: CacheCommand) -> Any:
        response = self._engine.cache_call.remote(command, hint=RouteHint(target=replica_id))
        return response.result(timeout_s=CALL_TIMEOUT_S)


def build_ingress(
    settings: FleetSettings, engine: DeploymentHandle, board: DeploymentHandle
) -> Server:
    """The ingress's server: registry, fleet engine client and cache, app, release controller."""
    config = settings.serve
    model_dir = settings.model_dir
    base = BaseModelSpec.from_dir(model_dir)
    registry = open_registry(registry_config(config), base=base)
    calls = RayCalls(engine, board)
    link = FleetLink(calls)
    try:
        client = FleetEngineClient(
            calls.open_stream, is_replica_lost, link, TextTokenizer(model_dir)
        )
        cache = FleetCache(link)
        admin = config.admin_key or admin_key(config.data_dir)
        front = Front(client, cache, cache.update_tenant_settings, admin, {})

        def release_env(pins: OwnedPins, traffic: ReleaseTraffic) -> FleetReleaseEnv:
            return FleetReleaseEnv(pins, client, traffic, link)

        server = build_front(
            config,
            model_dir,
            base,
            registry,
            front,
            release_env=release_env,
            fleet=FleetStateView(link),
        )
    except BaseException:
        link.close()
        registry.close()
        raise
    server.deps.metrics.registry.register(FleetCollector(link, lambda: client.num_retries))
    return server
