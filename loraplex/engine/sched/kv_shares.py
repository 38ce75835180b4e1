"""Per-tenant KV blocks: ``max_kv_blocks`` and who gives up blocks when they run out.

A tenant's blocks are those in its running sequences' block tables (a cached prefix block
shared by two sequences counts for both). ``max_kv_blocks`` bounds them beyond the tenant's
first sequence: a sequence is not admitted past it, and a sequence that would grow past it
preempts its own tenant's newest; the tenant's one running sequence may pass it, so the cap never
starves a request. When the engine's blocks run out, the newest sequence of the tenant holding
the most blocks per unit of weight gives its blocks up, so a tenant over its share yields first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from loraplex.engine.kv.blocks import BlockManager
from loraplex.engine.request import Request
from loraplex.engine.tenant_shares import TenantBook


class KvShares:
    """Reads the block tables of running sequences against the tenants' KV settings."""

    def __init__(self, blocks: BlockManager, tenants: TenantBook) -> None:
        self.blocks = blocks
        self.tenants = tenants

    def held(self, running: Iterable[Request]) -> Counter[str]:
        """KV blocks per tenant in its running sequences' block tables."""
        held: Counter[str] = Counter()
        for r in running:
            if r.seq_id is not None:
                held[r.tenant] += len(self.blocks.block_table(r.seq_id))
        return held

    def over_cap(self, req: Request, running: list[Request]) -> bool:
        """Admitting ``req`` (every token it has, so the bound holds whatever its first chunk
        and cached prefix) would take its tenant past its ``max_kv_blocks`` (a tenant with
        nothing running may always start one)."""
        cap = self.tenants.get(req.tenant).max_kv_blocks
        if cap is None:
            return False
        held = self.held(r for r in running if r.tenant == req.tenant)[req.tenant]
        return held > 0 and held + -(-req.num_tokens // self.blocks.block_size) > cap

    def at_cap(self, req: Request, n: int, running: list[Request]) -> bool:
        """Growing ``req`` by ``n`` tokens takes its tenant (with another sequence running)
        past its ``max_kv_blocks``."""
        cap = self.tenants.get(req.tenant).max_kv_blocks
        if cap is None:
            return False
        mine = [r for r in running if r.tenant == req.tenant]
        assert req.seq_id is not None  # RUNNING requests always hold a sequence
        need = self.blocks.blocks_needed(req.seq_id, req.num_computed_tokens + n)
        return len(mine) > 1 and need > 0 and self.held(mine)[req.tenant] + need > cap

    def victim(self, req: Request, n: int, running: list[Request], scheduled: set[str]) -> Request:
        """The sequence that gives up its blocks so ``req`` can grow by ``n``: at its tenant's
        ``max_kv_blocks``, that tenant's newest; otherwise the newest of the tenant holding the
        most blocks per unit of weight. Never one ``scheduled`` this step (``req`` may be it)."""
        candidates = [r for r in running if r.request_id not in scheduled]
        if self.at_cap(req, n, running):
            tenant = req.tenant
        else:
            held = self.held(running)
            mine = {r.tenant for r in candidates}
            tenant = max(mine, key=lambda t: (held[t] / self.tenants.weight(t), t))
        return next(r for r in reversed(candidates) if r.tenant == tenant)
