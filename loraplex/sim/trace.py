"""The simulator's input: one request per JSONL line, the WORKLOADS.md trace format.

``t_s, tenant, adapter, prompt_tokens, output_tokens`` are required (``adapter`` null: the base
model); ``rank`` and ``size_bytes`` optionally give the adapter's shape (else the sim config's
defaults). A server's request log (``request_log_path``, docs/operations.md) writes the same
lines plus the outcome fields ``OUTCOME_FIELDS``; a reader takes those too, so a log replays as
is, and ignores them (a simulation decides its own outcomes). Any other key is an error naming it.
``t_s`` is at most ``MAX_T_S``, ``prompt_tokens`` and ``output_tokens`` at most
``MAX_TRACE_TOKENS``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_FIELDS = ("t_s", "tenant", "adapter", "prompt_tokens", "output_tokens")
SHAPE_FIELDS = ("rank", "size_bytes")  # optional: the adapter's rank and bytes
# What a server's request log adds per finished request: its outcome (the finish reason, or
# "error"), seconds to its first token (null: none came), the tier its adapter was leased from
# (null: the base model or unknown) and seconds from arrival to the end.
# ``engine``: the engine's timeline of it (``server/request_log.ENGINE_FIELDS``) or null.
OUTCOME_FIELDS = ("outcome", "ttft_s", "tier", "latency_s", "engine")
# The latest arrival a trace may hold (1e7 s, 115.7 days): the virtual clock is a float of
# seconds, whose spacing stays under 2 ns below 1e7 s, so a hop or step keeps its length there.
# NOTE: any finite t_s was accepted. In a 3-request trace (one at 0, two at T; the cost model
# tests/sim/cost_example.json) every TTFT read 25.414 ms for T up to 1e9 s; at 1e12 one read
# 25.391 ms, at 1e15 0.0 ms, and at 1e300 (where a step no longer moves the clock) the two at T
# ended as QueueTimeoutError: ``sim run`` said completed 1 of 3, exit 0.
MAX_T_S = 1e7
# The most prompt or output tokens one trace request may hold (2**24, past any served model's
# context): the simulator builds each prompt as a tuple of its tokens. NOTE: unbounded, a line
# with 1e12 prompt tokens ended ``sim run`` in a MemoryError traceback.
MAX_TRACE_TOKENS = 1 << 24


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace (slotted: a scale run holds a million)."""

    t_s: float  # arrival, seconds from the start of the trace
    tenant: str  # the requesting tenant (owns the adapter)
    adapter: str | None  # adapter name within the tenant (a revision ref may follow); None: base
    prompt_tokens: int  # prompt length
    output_tokens: int  # tokens to generate
    rank: int | None = None  # the adapter's LoRA rank; None: the sim config's default
    size_bytes: int | None = None  # the adapter's bytes in memory; None: from its rank

    def __post_init__(self) -> None:
        t_s = self.t_s
        if isinstance(t_s, bool) or not (
            isinstance(t_s, int | float) and math.isfinite(t_s) and 0 <= t_s <= MAX_T_S
        ):
            raise ValueError(f"t_s {t_s!r} is invalid; expected a number from 0 to {MAX_T_S:g}")
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ValueError(f"tenant {self.tenant!r} is invalid; expected a non-empty string")
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter):
            raise ValueError(f"adapter {self.adapter!r} is invalid; expected a name or null")
        for name in ("prompt_tokens", "output_tokens", "rank", "size_bytes"):
            value = getattr(self, name)
            if value is None and name in SHAPE_FIELDS:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is invalid; expected an integer >= 1")
            if name in ("prompt_tokens", "output_tokens") and value > MAX_TRACE_TOKENS:
                raise ValueError(
                    f"{name} {value!r} is invalid; expected an integer from 1 to {MAX_TRACE_TOKENS}"
                )


def parse_record(body: Mapping[str, Any], where: str = "trace") -> TraceRecord:
    """One JSON object as a record; a missing or unknown key is a ValueError naming it."""
    missing = [k for k in TRACE_FIELDS if k not in body]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}; expected {list(TRACE_FIELDS)}")
    unknown = sorted(set(body) - {*TRACE_FIELDS, *SHAPE_FIELDS, *OUTCOME_FIELDS})
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}")
    try:
        return TraceRecord(**{k: body[k] for k in (*TRACE_FIELDS, *SHAPE_FIELDS) if k in body})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def read_trace(path: Path) -> list[TraceRecord]:
    """Every record of a JSONL trace file, sorted by arrival (stable); blank lines skipped."""
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                body = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from e
            if not isinstance(body, dict):
                raise ValueError(f"{where}: expected a JSON object")
            records.append(parse_record(body, where))
    return sorted(records, key=lambda r: r.t_s)


def nonempty(records: list[TraceRecord], path: Path) -> list[TraceRecord]:
    """The trace's records; none is a ValueError naming the file. NOTE: an empty file (or blank
    lines only) simulated as 0 requests, every figure undefined, exit 0; ``plan`` said no
    configuration met the objectives."""
    if not records:
        raise ValueError(f"{path} holds no request (empty, or blank lines only)")
    return records


def record_dict(record: TraceRecord) -> dict[str, Any]:
    """A record as its JSON object (shape fields only when set)."""
    body: dict[str, Any] = {k: getattr(record, k) for k in TRACE_FIELDS}
    body.update({k: getattr(record, k) for k in SHAPE_FIELDS if getattr(record, k) is not None})
    return body


def write_trace(records: Iterable[TraceRecord], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record_dict(record), sort_keys=True) + "\n")
