"""The fleet's Ray Serve deployments and the application they form.

- ``Board`` (one replica): every engine replica's latest status (``board.Board``), kept in a
  plain Ray actor it owns, which engine replicas push to (``board_store``).
- ``EngineReplica`` (``engine_replicas``): one ``EngineReplica`` each; Ray Serve routes calls
  to them with ``LoraplexRequestRouter`` and collects ``record_routing_stats`` every
  ``report_period_s``; each also pushes its status to the board's store.
- ``Ingress`` (one replica): the same FastAPI app as ``loraplex serve``
  (``ingress.build_ingress``), served by loraplex's own listener in the replica's process
  (``listener.py``) on the node the fleet's address is: the one ``fleet up`` runs on, else the
  Ray head (``serve run``, a RayService: where the KubeRay Service points). Ray Serve runs no
  HTTP proxy (``proxy_location: Disabled``).

Engines ask Ray for no logical CPUs: their compute threads are set by ``torch_threads`` (the
fleet CLI splits the machine's cores among the replicas), so Ray's accounting never refuses a
replica that the operator sized on purpose. NOTE: a replica that asks for nothing may be placed
on any node, the head included (Serve spreads replicas over every node); ``engine_resource`` (one
unit of a custom resource per engine) keeps engines on the nodes that advertise it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from loraplex.engine.protocol import EngineRequest, TokenDelta
from loraplex.engine.transport.messages import CacheCommand
from loraplex.engine.transport.packed_errors import pack_error
from loraplex.fleet.board import PUSH_INTERVAL_S, BoardEntry
from loraplex.fleet.board_store import find_store, start_store
from loraplex.fleet.routing import RANK_KEY
from loraplex.fleet.settings import FleetSettings
from loraplex.fleet.wire import Accepted, Failed, ReplicaLeftError, RouteHint
from loraplex.serve.logs import configure_logging

if TYPE_CHECKING:
    from loraplex.fleet.replica import EngineReplica

_log = logging.getLogger(__name__)
HEALTH_CHECK_PERIOD_S = 2.0  # Ray Serve asks each engine replica this often
HEALTH_CHECK_TIMEOUT_S = 10.0
ROUTING_STATS_TIMEOUT_S = 5.0
STORE_CALL_TIMEOUT_S = 10.0  # one push to, or read of, the board's store
# By import path: Ray imports it in every process that holds the engine deployment's handle.
ROUTER_CLASS = "loraplex.fleet.ray_router.LoraplexRequestRouter"
NODE_ID_LABEL = "ray.io/node-id"  # every Ray node's label of its own id (``ray._raylet``)
INGRESS_HEALTH_CHECK_PERIOD_S = 2.0  # Ray Serve asks the listening ingress this often
# Ray's resource of the head node alone (``ray._common.constants.HEAD_NODE_RESOURCE_NAME``; Serve
# places its controller with it): a share of it puts the ingress on the head.
HEAD_NODE_RESOURCE = "node:__internal_head__"
HEAD_NODE_SHARE = 0.001


class FleetBoardImpl:
    """The board's one replica (wrapped by ``serve.deployment`` in ``build_app``): it owns the
    store engine replicas push to (``board_store``) and answers reads of it. Nothing calls it
    that can freeze with a call in flight (``board_store``'s NOTE)."""

    def __init__(self, stale_after_s: float) -> None:
        self._stale_after_s = stale_after_s
        self._store = start_store(stale_after_s)

    async def entries(self) -> list[BoardEntry]:
        try:
            entries: list[BoardEntry] = await asyncio.wait_for(
                self._store.entries.remote(), STORE_CALL_TIMEOUT_S
            )
        except RayActorError:  # an earlier replica's store, gone with it: a new one
            self._store = await asyncio.to_thread(start_store, self._stale_after_s)
            raise
        return entries


class EngineDeploymentImpl:
    """One engine replica inside Ray Serve (wrapped by ``serve.deployment`` in ``build_app``)."""

    def __init__(self, settings: FleetSettings) -> None:
        # NOTE: imported here: the replica imports torch, and the ingress's and the board's
        # processes import this module too (they stay torch-free)
        from loraplex.fleet.replica import EngineReplica, build_replica_parts

        configure_logging(settings.serve.log_level)  # this replica's process: its start
        replica_id = serve.get_replica_context().replica_id.unique_id
        parts = build_replica_parts(settings.serve, settings.model_dir, replica_id)
        self._replica: EngineReplica = EngineReplica(replica_id, parts)
        self._store: Any = None  # the board's store (``board_store.find_store``), once found
        self._stop = threading.Event()
        self._pusher = threading.Thread(
            target=self._push_forever, name="loraplex-board-push", daemon=True
        )
        self._pusher.start()

    async def generate(
        self, request: EngineRequest, hint: RouteHint | None = None
    ) -> AsyncIterator[Accepted | TokenDelta | Failed]:
        misrouted = self._misrouted(hint)
        if misrouted is not None:
            yield misrouted
            return
        async for item in self._replica.generate(request):
            yield item

    async def cache_call(self, command: CacheCommand, hint: RouteHint | None = None) -> Any:
        """The command's result, or ``Failed`` with its domain error (so the class survives)."""
        misrouted = self._misrouted(hint)
        if misrouted is not None:
            return misrouted
        try:
            return await self._replica.cache_call(command)
        except Exception as exc:
            return Failed(pack_error(exc))

    def _misrouted(self, hint: RouteHint | None) -> Failed | None:
        """A call meant for another replica (it left): refused, never run here."""
        if hint is None or hint.target is None or hint.target == self._replica.replica_id:
            return None
        error = ReplicaLeftError(f"engine replica {hint.target} is not in rotation")
        return Failed(pack_error(error))

    async def record_routing_stats(self) -> dict[str, Any]:
        # NOTE: off the event loop (it reads the cache under its lock), like every cache read
        return _with_rank(await asyncio.to_thread(self._replica.routing_stats))

    def check_health(self) -> None:
        self._replica.check_health()

    def __del__(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):  # the board may be gone first
            if self._store is not None:
                self._store.remove.remote(self._replica.replica_id)
        self._replica.close()

    def _push_forever(self) -> None:
        failing = False
        while not self._stop.wait(PUSH_INTERVAL_S):
            try:
                if self._store is None:
                    self._store = find_store()
                pushed = self._store.put.remote(_with_rank(self._replica.status()))
                ray.get(pushed, timeout=STORE_CALL_TIMEOUT_S)
                failing = False
            except Exception:  # the board (re)starting: find it and push again next time
                self._store = None
                if not failing:  # once per run of failures, not every PUSH_INTERVAL_S
                    _log.warning("fleet: pushing status to the board failed", exc_info=True)
                failing = True


def _with_rank(stats: dict[str, Any]) -> dict[str, Any]:
    """``stats`` (routing stats, a board status) with this replica's deployment rank, which the
    router places by instead of its random id (``routing.PlacementNames``). Read every time:
    Ray may move a live replica to another rank (its reconfigure after a scale-down)."""
    rank = serve.get_replica_context().rank
    if rank is not None:
        stats[RANK_KEY] = rank.rank
    return stats


class FleetListenerImpl:
    """The ingress replica that listens itself: ``loraplex serve``'s app over the fleet, served
    by loraplex's listener (``listener.IngressListener``) on ``serve.host:serve.port``."""

    def __init__(
        self, settings: FleetSettings, engine: DeploymentHandle, board: DeploymentHandle
    ) -> None:
        from loraplex.fleet.ingress import build_ingress
        from loraplex.fleet.listener import IngressListener

        configure_logging(settings.serve.log_level)  # this replica's process: its start
        self._server = build_ingress(settings, engine, board)
        try:
            self._listener = IngressListener(settings.serve, self._server)
        except BaseException:
            self._server.close()
            raise

    def check_health(self) -> None:
        self._listener.check()

    def __del__(self) -> None:
        # NOTE: also on a replica whose constructor raised (its server is closed there already)
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.stop()
            self._server.close()


def build_app(settings: FleetSettings, ingress_node: str | None = None) -> Any:
    """The Serve application: board, engine replicas, ingress (on the Ray node of id
    ``ingress_node`` when given, else on the head node: where the fleet's address is)."""
    engine_actor: dict[str, Any] = {"num_cpus": 0}
    if settings.engine_resource is not None:
        engine_actor["resources"] = {settings.engine_resource: 1}
    engine_options = {
        "num_replicas": settings.engine_replicas,
        "ray_actor_options": engine_actor,
        # NOTE: the engine queues and bounds requests itself (max_queue_len, QueueFullError);
        # Ray's per-replica cap only has to stay above that.
        "max_ongoing_requests": settings.serve.max_queue_len + settings.serve.max_num_seqs,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        "request_router_config": RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_router_kwargs={
                "policy": settings.policy,
                "router_config": dict(settings.router),
                "seed": settings.seed,
                "stale_after_s": settings.stale_bound_s,
                "topology": settings.topology,
            },
            request_routing_stats_period_s=settings.report_period_s,
            request_routing_stats_timeout_s=ROUTING_STATS_TIMEOUT_S,
        ),
    }
    engine_deployment = serve.deployment(EngineDeploymentImpl, name="EngineReplica").options(
        **engine_options
    )
    ingress_deployment = _ingress_deployment(settings, ingress_node)
    board_deployment = serve.deployment(FleetBoardImpl, name="Board").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}
    )
    board = board_deployment.bind(settings.stale_bound_s)
    engine = engine_deployment.bind(settings)
    return ingress_deployment.bind(settings, engine, board)


def _ingress_deployment(settings: FleetSettings, node: str | None) -> Any:
    actor_options: dict[str, Any] = {"num_cpus": 0}
    if node is not None:
        actor_options["label_selector"] = {NODE_ID_LABEL: node}
    else:
        actor_options["resources"] = {HEAD_NODE_RESOURCE: HEAD_NODE_SHARE}
    return serve.deployment(FleetListenerImpl, name="Ingress").options(
        num_replicas=settings.ingress_replicas,
        ray_actor_options=actor_options,
        health_check_period_s=INGRESS_HEALTH_CHECK_PERIOD_S,
    )
