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
- The kept budget is shared max-min fairly, decided when the pause happens (``room_for``): a
  pause that finds the budget full frees the kept sequences of the tenant holding the most
  kept blocks, as long as that tenant holds more than the pausing tenant would with this one.
  So a tenant alone may use the whole budget, and one whose pauses filled it cannot keep
  another tenant out: with n tenants pausing, each keeps about 1/n of it. Before, the first
  tenant to pause many streams took the whole budget and every other tenant's pause
  recomputed on resume.
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

    def room_for(
        self, req: Request, running: Iterable[Request], paused: Container[str]
    ) -> list[Request] | None:
        """Whether ``req`` (running, about to be paused) may keep its sequence, and at whose
        cost: None when it may not (past its tenant's ``max_kv_blocks``, counting its running
        and kept blocks, or no fair room in the kept budget); else the other tenants' kept
        sequences to free first (often none). See the module docstring for the fair rule."""
        size = self._size(req)
        cap = self.tenants.get(req.tenant).max_kv_blocks
        if cap is not None:
            mine = sum(self._size(r) for r in running if r.tenant == req.tenant and r is not req)
            if mine + self.num_blocks(req.tenant) + size > cap:
                return None
        held: dict[str, int] = {}
        for kept in self.requests.values():
            held[kept.tenant] = held.get(kept.tenant, 0) + self._size(kept)
        after = held.pop(req.tenant, 0) + size  # what the pausing tenant would keep
        excess = sum(held.values()) + after - self.max_blocks
        victims: list[Request] = []
        while excess > 0:
            richest = max(held, key=held.__getitem__, default=None)
            if richest is None or held[richest] <= after:
                return None  # no other tenant keeps more than its fair part
            victim = self.victim(paused, richest, skip=victims)
            if victim is None:  # cannot happen: ``richest`` holds blocks
                return None
            victims.append(victim)
            held[richest] -= self._size(victim)
            excess -= self._size(victim)
        return victims

    def add(self, req: Request) -> None:
        self.requests[req.request_id] = req

    def discard(self, req: Request) -> None:
        """``req`` holds no kept sequence any more (admitted again, freed or retired)."""
        self.requests.pop(req.request_id, None)

    def victim(
        self,
        paused: Container[str],
        tenant: str | None = None,
        spare: Request | None = None,
        skip: Container[Request] = (),
    ) -> Request | None:
        """The kept sequence to free first (of ``tenant`` only, if given; never ``spare`` nor
        one in ``skip``): the oldest still paused, else the oldest resumed. None: none kept."""
        candidates = [
            r
            for r in self.requests.values()
            if r is not spare and r not in skip and (tenant is None or r.tenant == tenant)
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
