"""KV sequences kept across a pause (torch-free): which paused requests keep their KV blocks, and
which give them up first when blocks are needed.

A request paused because its consumer stopped reading (``RequestBook.pause``) used to free its
KV blocks, and its resume recomputed its prompt and output so far: a client reading just below
the engine's pace paused and resumed about once per ``stream_pause_bytes`` of events, each
resume a recompute of its whole context. Now a paused request keeps its sequence while that is
cheap, and resumed, it decodes on from where it stopped.

Invariants:
- A kept request is live, not running (WAITING or ADAPTER_WAIT: paused, or resumed and not yet
  admitted again) and holds its KV sequence (``seq_id``, ``num_computed_tokens``).
- A pause keeps the sequence only while the blocks of every kept sequence stay within
  ``max_paused_kv_fraction`` of the cache and, for a tenant with ``max_kv_blocks``, its
  running and kept blocks within that cap; otherwise it frees them as a preemption does.
- Kept blocks never starve running or waiting work: whenever the planner lacks blocks (or a
  tenant's cap is reached), kept sequences are freed first, still-paused ones before resumed
  ones, oldest pause first, before any running sequence is preempted (``planner``).
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.request import Request, RequestState
from loraplex.engine.tenant_shares import TenantBook
from loraplex.errors import CacheIntegrityError


class KeptKv:
    """The requests holding a KV sequence out of the running batch, in pause order."""

    def __init__(self, blocks: BlockManager, tenants: TenantBook, max_fraction: float) -> None:
        self.blocks = blocks
        self.tenants = tenants
        self.max_blocks = int(max_fraction * blocks.num_blocks)  # the bound on all kept blocks
        self.requests: dict[str, Request] = {}  # request id -> kept request, oldest pause first

    def __bool__(self) -> bool:
        return bool(self.requests)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.requests

    def num_blocks(self, tenant: str | None = None) -> int:
        """Blocks in the kept sequences' block tables (of ``tenant`` only, if given)."""
        return sum(
            self._size(r) for r in self.requests.values() if tenant is None or r.tenant == tenant
        )

    def may_keep(self, req: Request, running: Iterable[Request]) -> bool:
        """``req`` (running, about to be paused) may keep its sequence: within the bound on all
        kept blocks and its tenant's ``max_kv_blocks`` (its running and kept blocks)."""
        size = self._size(req)
        if self.num_blocks() + size > self.max_blocks:
            return False
        cap = self.tenants.get(req.tenant).max_kv_blocks
        if cap is None:
            return True
        mine = sum(self._size(r) for r in running if r.tenant == req.tenant and r is not req)
        return mine + self.num_blocks(req.tenant) + size <= cap

    def add(self, req: Request) -> None:
        self.requests[req.request_id] = req

    def discard(self, req: Request) -> None:
        """``req`` holds no kept sequence any more (admitted again, freed or retired)."""
        self.requests.pop(req.request_id, None)

    def victim(
        self, paused: Container[str], tenant: str | None = None, spare: Request | None = None
    ) -> Request | None:
        """The kept sequence to free first (of ``tenant`` only, if given; never ``spare``): the
        oldest still paused, else the oldest resumed. None: none kept."""
        candidates = [
            r
            for r in self.requests.values()
            if r is not spare and (tenant is None or r.tenant == tenant)
        ]
        return next((r for r in candidates if r.request_id in paused), None) or next(
            iter(candidates), None
        )

    def over_cap(self, running: Iterable[Request]) -> str | None:
        """A tenant with kept blocks whose running and kept blocks exceed its
        ``max_kv_blocks`` (its running sequences grew since it paused); None: none."""
        running = list(running)
        for tenant in dict.fromkeys(r.tenant for r in self.requests.values()):
            cap = self.tenants.get(tenant).max_kv_blocks
            if cap is None:
                continue
            mine = sum(self._size(r) for r in running if r.tenant == tenant)
            if mine + self.num_blocks(tenant) > cap:
                return tenant
        return None

    def check_integrity(self, live: Iterable[Request]) -> None:
        """Raises CacheIntegrityError naming the first broken invariant: exactly the kept
        requests hold a KV sequence out of the running batch, within the bound."""
        holding = {
            r.request_id: r
            for r in live
            if r.seq_id is not None and r.state is not RequestState.RUNNING
        }
        stray = sorted(holding.keys() ^ self.requests.keys())
        if stray:
            req = holding.get(stray[0]) or self.requests[stray[0]]
            raise CacheIntegrityError(
                "kept requests are those holding KV out of the running batch",
                f"{req.request_id!r}: {req.state.value}, seq {req.seq_id}",
            )
        if self.num_blocks() > self.max_blocks:
            raise CacheIntegrityError(
                "kept blocks within max_paused_kv_fraction",
                f"{self.num_blocks()} blocks kept; at most {self.max_blocks}",
            )

    def _size(self, req: Request) -> int:
        return 0 if req.seq_id is None else len(self.blocks.block_table(req.seq_id))
