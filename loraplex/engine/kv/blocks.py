"""KV block bookkeeping: fixed-size blocks, a block table per sequence, refcounts and prefix
reuse keyed by tenant and adapter revision (torch-free; ``paged.PagedKVCache`` owns the tensors).

A full block is identified by a chain digest over (namespace, every token up to its end), where
the namespace is the request's tenant and the adapter revision's full identity
(``str(AdapterKey)``) or ``"base"``. Keys and values depend on the adapter, so two revisions
never share a block even for equal tokens; two tenants never share one either (a cache hit on
another tenant's prefix would show in the time to first token, ``namespace_of``).
Freed blocks keep their digest and stay reusable until the allocator hands them out again
(least recently freed first).

Invariants (``check_integrity``): a block is either free (refcount 0, in the free list) or
referenced by exactly ``refcount`` block-table entries; every digest maps to a block carrying it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import CacheIntegrityError, CapacityError

BASE_NAMESPACE = "base"


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, rows: int, element_bytes: int
) -> int:
    """Bytes of a paged KV cache of ``rows`` token rows (``num_kv_blocks`` x ``block_size``):
    keys and values of every layer, plus the one padding row ``PagedKVCache`` keeps."""
    return 2 * num_layers * (rows + 1) * num_kv_heads * head_dim * element_bytes


def namespace_of(tenant: str, key: AdapterKey | None) -> str:
    """Prefix-reuse scope of a request: its tenant and its adapter revision's full identity.
    NOTE: keyed by the revision alone, the base model's blocks and a public adapter's were
    shared by every tenant, and a prompt that found another tenant's cached prefix answered
    sooner: its time to first token told a tenant what another had just sent."""
    return f"{tenant}\x00{BASE_NAMESPACE if key is None else key}"


@dataclass
class _Sequence:
    namespace: str  # prefix-reuse scope: its tenant and adapter revision (``namespace_of``)
    blocks: list[int] = field(default_factory=list)  # block table: position // block_size -> block
    num_hashed: int = 0  # leading full blocks whose digests are registered
    digest: bytes = b""  # chain digest of the last hashed block


class BlockManager:
    """``num_blocks`` blocks of ``block_size`` token positions shared by all sequences."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks {num_blocks} / block_size {block_size} are invalid; expected >= 1"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refcount = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._digest_of: dict[int, bytes] = {}  # block -> its chain digest (full blocks only)
        self._block_of: dict[bytes, int] = {}  # chain digest -> block holding it
        self._seqs: dict[int, _Sequence] = {}
        self._next_seq = 0

    # --- views ----------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks no live sequence references."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by a live sequence (0-1)."""
        return 1 - len(self._free) / self.num_blocks

    def block_table(self, seq_id: int) -> list[int]:
        return self._seqs[seq_id].blocks

    def blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        """New blocks ``seq_id`` needs to hold ``num_tokens`` positions."""
        have = len(self._seqs[seq_id].blocks)
        return max(0, -(-num_tokens // self.block_size) - have)

    def can_grow(self, seq_id: int, num_tokens: int) -> bool:
        return self.blocks_needed(seq_id, num_tokens) <= len(self._free)

    # --- sequences ------------------------------------------------------------------------

    def allocate(self, namespace: str = BASE_NAMESPACE) -> int:
        """A new sequence with an empty block table."""
        seq_id = self._next_seq
        self._next_seq += 1
        self._seqs[seq_id] = _Sequence(namespace)
        return seq_id

    def match_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Attach cached full blocks of the same namespace matching ``token_ids``' prefix;
        returns the number of tokens covered. At least one token is always left to compute
        (its logits are needed), so a fully cached prompt reuses all but its last block."""
        seq = self._seqs[seq_id]
        if seq.blocks:
            raise ValueError(f"seq_id {seq_id} already has blocks; expected a fresh sequence")
        size = self.block_size
        for start in range(0, len(token_ids) - 1 - size + 1, size):
            digest = _chain(seq.digest, seq.namespace, token_ids[start : start + size])
            block = self._block_of.get(digest)
            if block is None:
                break
            if self._refcount[block] == 0:
                del self._free[block]
            self._refcount[block] += 1
            seq.blocks.append(block)
            seq.digest, seq.num_hashed = digest, seq.num_hashed + 1
        return len(seq.blocks) * size

    def grow(self, seq_id: int, num_tokens: int) -> None:
        """Give ``seq_id`` blocks for ``num_tokens`` positions; CapacityError if too few free."""
        needed = self.blocks_needed(seq_id, num_tokens)
        if needed > len(self._free):
            raise CapacityError(
                f"KV cache: sequence needs {needed} more blocks; {len(self._free)} are free"
            )
        for _ in range(needed):
            block, _ = self._free.popitem(last=False)
            stale = self._digest_of.pop(block, None)
            if stale is not None:
                del self._block_of[stale]
            self._refcount[block] = 1
            self._seqs[seq_id].blocks.append(block)

    def fills(self, seq_id: int, num_tokens: int) -> bool:
        """Whether ``record`` of ``num_tokens`` tokens would register a block: one not yet
        registered is full (callers skip building the token list otherwise)."""
        seq = self._seqs[seq_id]
        return (seq.num_hashed + 1) * self.block_size <= num_tokens and seq.num_hashed < len(
            seq.blocks
        )

    def record(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """Register digests of blocks that ``token_ids`` (the tokens whose keys/values are now
        cached, from position 0) fill completely, so later sequences can reuse them."""
        seq, size = self._seqs[seq_id], self.block_size
        while (seq.num_hashed + 1) * size <= len(token_ids) and seq.num_hashed < len(seq.blocks):
            start = seq.num_hashed * size
            digest = _chain(seq.digest, seq.namespace, token_ids[start : start + size])
            block = seq.blocks[seq.num_hashed]
            if digest not in self._block_of and block not in self._digest_of:
                self._block_of[digest] = block
                self._digest_of[block] = digest
            seq.digest, seq.num_hashed = digest, seq.num_hashed + 1

    def free(self, seq_id: int) -> None:
        seq = self._seqs.pop(seq_id)
        # Last block first: a sequence's tail is the least likely to be shared again, so it
        # should be handed out before its head.
        for block in reversed(seq.blocks):
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                self._free[block] = None

    def check_integrity(self) -> None:
        counts = [0] * self.num_blocks
        for seq in self._seqs.values():
            for block in seq.blocks:
                counts[block] += 1
        for block in range(self.num_blocks):
            if counts[block] != self._refcount[block]:
                raise CacheIntegrityError(
                    "refcount equals block-table references",
                    f"block {block}: {self._refcount[block]} vs {counts[block]}",
                )
            if (counts[block] == 0) != (block in self._free):
                raise CacheIntegrityError(
                    "free list holds exactly the unreferenced blocks", f"block {block}"
                )
        for digest, block in self._block_of.items():
            if self._digest_of.get(block) != digest:
                raise CacheIntegrityError("digest maps agree", f"block {block}")


def _chain(parent: bytes, namespace: str, tokens: Sequence[int]) -> bytes:
    hasher = hashlib.sha256(parent)
    if not parent:
        hasher.update(namespace.encode())
    hasher.update(array("q", tokens).tobytes())
    return hasher.digest()
