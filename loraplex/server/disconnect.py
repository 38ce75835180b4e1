"""Awaiting a request's engine output while watching for its client to leave: Uvicorn does not
cancel a handler whose client left, so every wait races the client's disconnect, and a client
that leaves aborts every sibling (its queue places, KV blocks and adapter leases freed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import anyio
from starlette.requests import Request

from loraplex.server.choices import ChoiceOutput, Fanout, Slotted

T = TypeVar("T")


class ClientDisconnectedError(Exception):
    """The client closed the connection before its response was complete."""


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        continue


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientDisconnectedError (``work`` cancelled) if the client leaves
    first. Uvicorn does not cancel a handler whose client left, so waits must watch for it."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task})
    if task.cancelled():
        raise ClientDisconnectedError
    return task.result()


async def first_item(fanout: Fanout) -> Slotted | None:
    """The first delta of any sibling, awaited before any response byte is sent so that queue
    timeouts and load failures still get their own HTTP status (None: every stream ended at
    once). An error has already aborted every sibling (``Fanout``)."""
    try:
        return await anext(fanout)
    except StopAsyncIteration:
        return None


async def start_stream(request: Request, fanout: Fanout) -> Slotted | None:
    """The first delta (see ``first_item``); every sibling is aborted if the client leaves
    while they wait in the queue."""
    try:
        return await unless_disconnected(request, first_item(fanout))
    except ClientDisconnectedError:
        await fanout.abort()
        raise


async def _drain(fanout: Fanout, first: Slotted | None, outputs: list[ChoiceOutput]) -> None:
    item = first
    while item is not None:
        slot, delta = item
        outputs[slot].add(delta)
        item = await anext(fanout, None)
    await fanout.abort()  # every sibling ended: this only closes the streams


async def collect(request: Request, fanout: Fanout, num_slots: int) -> list[ChoiceOutput]:
    """The whole output of every sibling, by slot; ClientDisconnectedError if the client left
    first (every sibling is then aborted and its lease released)."""
    outputs = [ChoiceOutput() for _ in range(num_slots)]
    first = await start_stream(request, fanout)
    try:
        await unless_disconnected(request, _drain(fanout, first, outputs))
    except ClientDisconnectedError:
        await fanout.abort()
        raise
    return outputs
