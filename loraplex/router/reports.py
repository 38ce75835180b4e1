"""What one engine replica tells the router: which revisions it holds where, and how busy it is.

A replica sends a report at least once a second (on Ray Serve through
``record_routing_stats()``), so the encoding is compact JSON: residency sets as sorted lists,
and as a Bloom filter once a set has more than ``MAX_EXACT_KEYS`` keys. Decoding validates
everything: a malformed report raises ``MalformedReportError`` naming the field, and the caller
treats that replica as unreported (never a crash of the router).

Revision keys are plain strings (``AdapterKey``'s string form, or ``tenant/name@revision#digest``);
the router only compares them, so it needs no artifact code.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeAlias, TypeGuard

from loraplex.errors import LoraplexError, quoted
from loraplex.router.bloom import MAX_BITS, BloomFilter

# 2: load.num_adapter_wait apart from load.num_queued; 3: residency.merged
REPORT_VERSION = 3
# A set larger than this is sent as a Bloom filter (a few KiB however many revisions are
# resident); below it, an exact list is about as small and has no false positives.
MAX_EXACT_KEYS = 256
# The false-positive rate a report's Bloom filters are sized for.
BLOOM_FALSE_POSITIVE_RATE = 0.01
# Bounds a decoder enforces, so one bad replica cannot make the router allocate without limit.
MAX_KEYS_PER_SET = 65536
MAX_KEY_CHARS = 512
MAX_REPLICA_ID_CHARS = 256

# A residency set as received: exact, or a Bloom filter (``key in s`` works on both).
KeySet: TypeAlias = frozenset[str] | BloomFilter


class MalformedReportError(LoraplexError):
    """A replica report does not decode: wrong version, type, range or an unknown field."""

    def __init__(self, field: str, detail: str) -> None:
        self.field = field
        super().__init__(f"replica report: field {quoted(field)} {detail}")


@dataclass(frozen=True)
class Residency:
    """Which revision keys a replica holds in each place. A key may be in several sets (the
    tiers are inclusive); the router takes the fastest."""

    l0: KeySet = frozenset()  # GPU slots
    l1: KeySet = frozenset()  # CPU (pinned host memory)
    l2: KeySet = frozenset()  # local disk
    loading: KeySet = frozenset()  # being brought into L0 right now
    pinned: KeySet = frozenset()  # pinned by an operator or a release: never evicted
    # merged into the replica's base weights (docs/modes.md): its tokens skip the LoRA op there
    merged: KeySet = frozenset()


@dataclass(frozen=True)
class ReplicaLoad:
    """How busy a replica is when it reports."""

    num_queued: int = 0  # requests waiting for a seat (their adapter resident, or the base model)
    num_running: int = 0  # sequences in the running batch
    num_active_tokens: int = 0  # prompt + generated tokens of queued and running requests
    kv_usage: float = 0.0  # fraction of KV cache blocks in use, 0..1
    evictions_per_min: float = 0.0  # adapter evictions (any tier) over the last minute
    num_adapter_wait: int = 0  # requests waiting for their adapter to be loaded

    def __post_init__(self) -> None:
        for f in fields(self):
            problem = _load_problem(f.name, getattr(self, f.name))
            if problem:
                raise ValueError(f"{f.name} {problem}")


@dataclass(frozen=True)
class ReplicaReport:
    """One replica's state at ``at_s``.

    ``at_s`` is on the router's clock: whoever hands reports to the router stamps them when
    received (replica clocks are not comparable across hosts).
    """

    replica_id: str  # the serving framework's replica id
    at_s: float  # when the state was observed, router clock
    residency: Residency  # revisions held, per place
    load: ReplicaLoad  # how busy it is

    def __post_init__(self) -> None:
        for name in ("replica_id", "at_s"):
            problem = _report_problem(name, getattr(self, name))
            if problem:
                raise ValueError(f"{name} {problem}")


def _load_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be the load field ``name``; None when it can."""
    if name in ("kv_usage", "evictions_per_min"):
        upper = 1.0 if name == "kv_usage" else math.inf
        if not _is_number(value) or not 0.0 <= value <= upper:
            return f"{quoted(value)} is invalid; expected a number in [0, {upper}]"
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{quoted(value)} is invalid; expected an integer >= 0"
    return None


def _report_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be the report field ``name``; None when it can."""
    if name == "replica_id":
        if not isinstance(value, str) or not 0 < len(value) <= MAX_REPLICA_ID_CHARS:
            return f"{quoted(value)} is invalid; expected 1..{MAX_REPLICA_ID_CHARS} characters"
        return None
    if not _is_number(value):
        return f"{quoted(value)} is invalid; expected a finite number"
    return None


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _encode_set(keys: KeySet, max_exact_keys: int, false_positive_rate: float) -> Any:
    if isinstance(keys, BloomFilter):
        return _encode_bloom(keys)
    if len(keys) > max_exact_keys:
        return _encode_bloom(BloomFilter.of(keys, false_positive_rate))
    return sorted(keys)


def _encode_bloom(bloom: BloomFilter) -> dict[str, Any]:
    return {
        "bits": base64.b64encode(bloom.bits).decode("ascii"),
        "num_bits": bloom.num_bits,
        "num_hashes": bloom.num_hashes,
        "num_keys": bloom.num_keys,
    }


def encode_report(
    report: ReplicaReport,
    max_exact_keys: int = MAX_EXACT_KEYS,
    false_positive_rate: float = BLOOM_FALSE_POSITIVE_RATE,
) -> dict[str, Any]:
    """``report`` as a JSON-able dict (``json.dumps`` takes it as is)."""
    residency = {
        f.name: _encode_set(getattr(report.residency, f.name), max_exact_keys, false_positive_rate)
        for f in fields(Residency)
    }
    load = {f.name: getattr(report.load, f.name) for f in fields(ReplicaLoad)}
    return {
        "v": REPORT_VERSION,
        "replica_id": report.replica_id,
        "at_s": report.at_s,
        "residency": residency,
        "load": load,
    }


def _object(value: object, field: str, names: Iterable[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise MalformedReportError(field, f"is {type(value).__name__}; expected an object")
    expected = set(names)
    unknown = sorted(str(k) for k in value if k not in expected)
    if unknown:
        raise MalformedReportError(f"{field}.{unknown[0]}", "is unknown")
    missing = sorted(expected - set(value))
    if missing:
        raise MalformedReportError(f"{field}.{missing[0]}", "is missing")
    return value


def _decode_set(value: object, field: str) -> KeySet:
    if isinstance(value, list):
        if len(value) > MAX_KEYS_PER_SET:
            raise MalformedReportError(field, f"has {len(value)} keys; at most {MAX_KEYS_PER_SET}")
        for key in value:
            if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
                raise MalformedReportError(
                    field, f"holds {quoted(key)}; expected strings of 1..{MAX_KEY_CHARS} chars"
                )
        return frozenset(value)
    bloom = _object(value, field, ("bits", "num_bits", "num_hashes", "num_keys"))
    for name in ("num_bits", "num_hashes", "num_keys"):
        if isinstance(bloom[name], bool) or not isinstance(bloom[name], int):
            raise MalformedReportError(f"{field}.{name}", "is not an integer")
    if not isinstance(bloom["bits"], str) or len(bloom["bits"]) > MAX_BITS // 6 + 4:
        raise MalformedReportError(f"{field}.bits", "is not a base64 string of bounded size")
    try:
        bits = base64.b64decode(bloom["bits"], validate=True)
        return BloomFilter(bloom["num_bits"], bloom["num_hashes"], bits, bloom["num_keys"])
    except (binascii.Error, ValueError) as e:
        raise MalformedReportError(field, f"is not a valid Bloom filter: {e}") from e


def decode_report(payload: object) -> ReplicaReport:
    """The report ``payload`` (a parsed JSON value) encodes; ``MalformedReportError`` if it
    is not exactly a valid report of this version."""
    top = _object(payload, "report", ("v", "replica_id", "at_s", "residency", "load"))
    if top["v"] != REPORT_VERSION or isinstance(top["v"], bool):
        raise MalformedReportError("v", f"is {quoted(top['v'])}; expected {REPORT_VERSION}")
    names = [f.name for f in fields(Residency)]
    raw = _object(top["residency"], "residency", names)
    residency = Residency(**{n: _decode_set(raw[n], f"residency.{n}") for n in names})
    raw_load = _object(top["load"], "load", [f.name for f in fields(ReplicaLoad)])
    for name, value in raw_load.items():
        problem = _load_problem(name, value)
        if problem:
            raise MalformedReportError(f"load.{name}", problem)
    for name in ("replica_id", "at_s"):
        problem = _report_problem(name, top[name])
        if problem:
            raise MalformedReportError(name, problem)
    return ReplicaReport(top["replica_id"], top["at_s"], residency, ReplicaLoad(**raw_load))
