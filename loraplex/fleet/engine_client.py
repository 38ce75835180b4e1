"""``FleetEngineClient``: the ``EngineClient`` the ingress's HTTP code uses in a fleet.

``generate`` opens a stream on the engine deployment (the request router picks the replica);
the replica answers ``Accepted`` first. If the replica is lost before the request's first token
(it died, or left rotation while the request was queued there), the request is sent again with
that replica avoided, up to ``MAX_ATTEMPTS`` times: a queued request has cost nothing visible
yet. Once a token was streamed a lost replica ends the request with ``EngineUnavailableError``
(its output cannot be resumed elsewhere). A request not accepted by any replica within its
queue deadline fails with ``QueueTimeoutError``.

``load_snapshot`` and ``health`` answer from the board (``FleetLink``): the sums over healthy
replicas, and up while at least one replica is healthy. The load also names every revision
merged into some replica's base weights (``EngineLoad.replicas_merged``), which the admin guard
and a release read as a single engine's merge (docs/modes.md, "In a fleet").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from loraplex.engine.protocol import EngineHealth, EngineLoad, EngineRequest, TokenDelta
from loraplex.engine.transport.packed_errors import unpack_error
from loraplex.errors import EngineUnavailableError, QueueTimeoutError
from loraplex.fleet import routing
from loraplex.fleet.link import FleetLink
from loraplex.fleet.wire import Accepted, Failed, RouteHint
from loraplex.model.tokenizer import TextTokenizer

# Sends of one request: the first and one retry after a lost replica. NOTE: one, because a
# request that itself brings its replica down (a poison request) must not take out more than two.
MAX_ATTEMPTS = 2
DEFAULT_ACCEPT_TIMEOUT_S = 30.0  # waiting for a replica to take a request without a deadline


class ReplicaStream(Protocol):
    """One open ``generate`` call on a replica (Ray Serve's DeploymentResponseGenerator)."""

    def __aiter__(self) -> AsyncIterator[Any]: ...

    def cancel(self) -> None: ...


class FleetEngineClient:
    """``EngineClient`` over the engine deployment (see the module docstring)."""

    def __init__(
        self,
        open_stream: Callable[[EngineRequest, RouteHint], ReplicaStream],
        is_replica_lost: Callable[[BaseException], bool],
        link: FleetLink,
        tokenizer: TextTokenizer,
    ) -> None:
        self._open = open_stream
        self._is_lost = is_replica_lost
        self._link = link
        self._tokenizer = tokenizer
        self._live: dict[str, ReplicaStream] = {}  # request id -> its open stream
        self.num_retries = 0  # requests sent again after their replica was lost

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._tokenizer

    def shutdown(self) -> None:
        """Stops reading the board (the replicas belong to Ray Serve and stay up)."""
        self._link.close()

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        avoid: set[str] = set()
        for attempt in range(MAX_ATTEMPTS):
            stream = self._open(request, RouteHint(avoid=frozenset(avoid)))
            self._live[request.request_id] = stream
            accepted: str | None = None
            streamed = False
            finished = False
            try:
                items = aiter(stream)
                first = await self._first(items, request)
                if isinstance(first, Accepted):
                    accepted = first.replica_id
                async for item in items:
                    if isinstance(item, Failed):
                        raise unpack_error(item.error)
                    if isinstance(item, TokenDelta):
                        if not streamed:
                            routing.UNADMITTED.admitted(request.tenant, request.request_id)
                        streamed = True
                        yield item
                finished = True
                return
            except Exception as exc:
                if not self._is_lost(exc):
                    raise
                if streamed or attempt + 1 == MAX_ATTEMPTS:
                    raise EngineUnavailableError(
                        f"the engine replica serving request {request.request_id} was lost"
                    ) from exc
                if accepted is not None:
                    avoid.add(accepted)
                self.num_retries += 1
            finally:
                self._live.pop(request.request_id, None)
                if not streamed:  # refused, cancelled or lost before its first token
                    routing.UNADMITTED.withdraw(request.tenant, request.request_id)
                else:  # answered, or cut after its first token: no longer its replica's load
                    routing.UNADMITTED.ended(request.tenant, request.request_id)
                if not finished:
                    stream.cancel()  # the caller stopped reading, or the request failed

    async def generate_on(
        self, replica_id: str, request: EngineRequest
    ) -> AsyncIterator[TokenDelta]:
        """``request`` on replica ``replica_id`` only (a release probe), never retried."""
        stream = self._open(request, RouteHint(target=replica_id))
        finished = False
        try:
            items = aiter(stream)
            await self._first(items, request)
            async for item in items:
                if isinstance(item, Failed):
                    raise unpack_error(item.error)
                if isinstance(item, TokenDelta):
                    yield item
            finished = True
        finally:
            if not finished:
                stream.cancel()

    async def _first(self, items: AsyncIterator[Any], request: EngineRequest) -> Any:
        timeout_s = request.deadline_s or DEFAULT_ACCEPT_TIMEOUT_S
        started = time.monotonic()
        try:
            first = await asyncio.wait_for(anext(items), timeout_s)
        except TimeoutError:
            waited = time.monotonic() - started
            raise QueueTimeoutError(request.request_id, waited, 1.0) from None
        if isinstance(first, Failed):
            raise unpack_error(first.error)
        return first

    async def pause(self, request_id: str) -> None:
        """NOTE: not passed on: the replica's stream is a Ray Serve streaming call, with no
        channel back to the replica's engine but its cancellation. Through a fleet, a stream
        whose client stops reading is aborted at ``max_stream_buffer_bytes`` instead
        (docs/operations.md, "Clients that stop reading")."""

    async def resume(self, request_id: str) -> None:
        """Nothing was paused (``pause``)."""

    async def abort(self, request_id: str) -> None:
        stream = self._live.get(request_id)
        if stream is not None:
            stream.cancel()

    def load_snapshot(self) -> EngineLoad:
        entries = self._link.entries()
        loads = [e.status["load"] for e in entries if e.healthy]
        # NOTE: every replica on the board, healthy or not: a hung replica's merge is still in
        # its weights, and the admin guard must not let its revision go (docs/modes.md).
        merged = {r for e in entries for r in e.status["load"].merged_revisions}
        if not loads:
            raise EngineUnavailableError("no engine replica is in rotation")
        running = {key: None for load in loads for key in load.running_adapters}
        waiting = {key: None for load in loads for key in load.waiting_adapters}
        lora_running = {key: None for load in loads for key in load.lora_running}
        lora_waiting = {key: None for load in loads for key in load.lora_waiting}
        return EngineLoad(
            num_waiting=sum(load.num_waiting for load in loads),
            num_adapter_wait=sum(load.num_adapter_wait for load in loads),
            num_running=sum(load.num_running for load in loads),
            kv_usage=sum(load.kv_usage for load in loads) / len(loads),
            running_adapters=tuple(running),
            waiting_adapters=tuple(k for k in waiting if k not in running),
            max_loras=sum(load.max_loras for load in loads),
            num_active_tokens=sum(load.num_active_tokens for load in loads),
            replicas_merged=frozenset(merged),
            num_paused=sum(load.num_paused for load in loads),
            num_pauses=sum(load.num_pauses for load in loads),
            num_resumes=sum(load.num_resumes for load in loads),
            num_pauses_kv_kept=sum(load.num_pauses_kv_kept for load in loads),
            num_paused_kv_freed=sum(load.num_paused_kv_freed for load in loads),
            num_resume_recomputed_tokens=sum(load.num_resume_recomputed_tokens for load in loads),
            lora_running=tuple(lora_running),
            lora_waiting=tuple(lora_waiting),
        )

    def health(self) -> EngineHealth:
        entries = self._link.entries()
        healthy = [e for e in entries if e.healthy]
        departed = self._link.num_departed
        if healthy:
            return EngineHealth(up=True, num_restarts=departed, down_reason=None)
        reason = (
            "no engine replica has reported yet"
            if not entries
            else f"none of the {len(entries)} engine replicas is healthy"
        )
        starting = not entries and departed == 0  # no replica has ever reported
        return EngineHealth(up=False, num_restarts=departed, down_reason=reason, starting=starting)
