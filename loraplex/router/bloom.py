"""A Bloom filter over revision keys, so a replica with thousands of resident revisions still
sends a report of a few kilobytes.

Membership has false positives only (never false negatives): the router may believe a revision
is on a replica when it is not, which costs one cold load there, never a wrong answer. The size
is chosen for a target false-positive rate at the number of keys inserted.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

# Smallest filter ever built: a filter of a handful of keys still answers with a low rate.
MIN_BITS = 64
# Largest filter a report may carry (2 MiB of bits); a decoder refuses anything larger.
MAX_BITS = 1 << 24
MAX_HASHES = 32


def _positions(key: str, num_bits: int, num_hashes: int) -> list[int]:
    """Bit positions of ``key`` by double hashing (Kirsch–Mitzenmacher) over one blake2b digest.

    NOTE: never Python's ``hash()``: it is salted per process, and the replica and the router
    are different processes.
    """
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest()
    first = int.from_bytes(digest[:8], "little")
    step = int.from_bytes(digest[8:], "little") | 1
    return [(first + i * step) % num_bits for i in range(num_hashes)]


class BloomFilter:
    """An immutable set of strings with bounded false positives; ``key in bloom`` tests it."""

    def __init__(self, num_bits: int, num_hashes: int, bits: bytes, num_keys: int) -> None:
        if not MIN_BITS <= num_bits <= MAX_BITS or num_bits % 8:
            raise ValueError(
                f"num_bits {num_bits} is invalid; expected a multiple of 8 in "
                f"[{MIN_BITS}, {MAX_BITS}]"
            )
        if not 1 <= num_hashes <= MAX_HASHES:
            raise ValueError(f"num_hashes {num_hashes} is invalid; expected 1..{MAX_HASHES}")
        if len(bits) != num_bits // 8:
            raise ValueError(f"bits has {len(bits)} bytes; expected {num_bits // 8}")
        if num_keys < 0:
            raise ValueError(f"num_keys {num_keys} is invalid; expected >= 0")
        self.num_bits = num_bits
        self.num_hashes = num_hashes
        self.bits = bytes(bits)
        self.num_keys = num_keys  # keys inserted (the set's size, for "fewest models" choices)

    @classmethod
    def of(cls, keys: Iterable[str], false_positive_rate: float) -> BloomFilter:
        """A filter holding ``keys``, sized for ``false_positive_rate`` at their number."""
        if not 0.0 < false_positive_rate < 1.0:
            raise ValueError(
                f"false_positive_rate {false_positive_rate} is invalid; expected in (0, 1)"
            )
        unique = set(keys)
        n = max(1, len(unique))
        # The optimal sizes: m = -n ln p / (ln 2)^2 bits and k = (m / n) ln 2 hashes.
        wanted = math.ceil(-n * math.log(false_positive_rate) / math.log(2) ** 2)
        num_bits = min(MAX_BITS, max(MIN_BITS, (wanted + 7) // 8 * 8))
        num_hashes = min(MAX_HASHES, max(1, round(num_bits / n * math.log(2))))
        bits = bytearray(num_bits // 8)
        for key in unique:
            for pos in _positions(key, num_bits, num_hashes):
                bits[pos >> 3] |= 1 << (pos & 7)
        return cls(num_bits, num_hashes, bytes(bits), len(unique))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return all(
            self.bits[pos >> 3] >> (pos & 7) & 1
            for pos in _positions(key, self.num_bits, self.num_hashes)
        )

    def __len__(self) -> int:
        return self.num_keys

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BloomFilter):
            return NotImplemented
        return (self.num_bits, self.num_hashes, self.bits, self.num_keys) == (
            other.num_bits,
            other.num_hashes,
            other.bits,
            other.num_keys,
        )

    def __hash__(self) -> int:
        return hash((self.num_bits, self.num_hashes, self.bits, self.num_keys))

    def __repr__(self) -> str:
        return f"BloomFilter(num_keys={self.num_keys}, num_bits={self.num_bits})"
