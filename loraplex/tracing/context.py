"""W3C trace context (``traceparent``) and the ratio decision (torch-free).

A request's trace id comes from the caller's valid ``traceparent`` header (its trace goes on
under the caller's span) or is made here. As the W3C spec says, a malformed ``traceparent`` is
not an error: the request starts a new trace.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import re
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
MAX_TRACEPARENT_CHARS = 55  # version 00's exact length; longer values are never parsed
_SAMPLED = 0x01
_ID_MASK_64 = (1 << 64) - 1


@dataclass(frozen=True)
class SpanIds:
    """Where a span sits: its trace, its own id, its parent (None: a root)."""

    trace_id: int  # 128-bit, never 0
    span_id: int  # 64-bit, never 0
    parent_id: int | None  # the parent span's id; None: the trace's root
    parent_sampled: bool = False  # the caller's traceparent said sampled

    def traceparent(self) -> str:
        """This span as a W3C ``traceparent`` (sampled flag set: the engine records it)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a valid header; None otherwise."""
    if value is None or len(value) > MAX_TRACEPARENT_CHARS:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, bool(int(match.group(4), 16) & _SAMPLED)


def new_span_id(rng: random.Random) -> int:
    return rng.getrandbits(64) or 1


def root_ids(header: str | None, rng: random.Random) -> SpanIds:
    """The ids of a request's server span: under the caller's span when ``header`` is valid."""
    parsed = parse_traceparent(header)
    if parsed is None:
        return SpanIds(rng.getrandbits(128) or 1, new_span_id(rng), None)
    trace_id, parent_id, sampled = parsed
    return SpanIds(trace_id, new_span_id(rng), parent_id, sampled)


def keyed_trace_id(secret: bytes, trace_id: int) -> int:
    """``trace_id`` hashed with ``secret`` (HMAC-SHA256, 64 bits), for the ratio to decide on
    when the caller chose the id: without the secret it cannot pick one the ratio keeps."""
    message = b"ratio\x00" + trace_id.to_bytes(16, "big")  # apart from ``NameMasker``'s names
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "big")


def ratio_keeps(trace_id: int, ratio: float) -> bool:
    """Whether ``ratio`` keeps ``trace_id``: its low 64 bits under ratio × 2^64 (as
    OpenTelemetry's TraceIdRatioBased), so every process deciding on one trace agrees."""
    return (trace_id & _ID_MASK_64) < int(ratio * (1 << 64))
