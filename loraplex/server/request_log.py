"""``RequestLog``: one JSONL line per finished request, in the simulator's trace format.

``request_log_path`` (docs/operations.md) turns it on. Each line has the trace fields the
simulator replays (``t_s`` seconds since the log began: since this server opened it on its
monotonic clock, plus where an existing log left off, ``resume_offset_s``; ``tenant``,
``adapter`` as ``name@revision``, ``owner/name@revision`` for another tenant's public adapter,
or null for the base model, ``prompt_tokens``, ``output_tokens``, and for an adapter its
``rank`` (the revision's largest) and ``size_bytes`` (its bytes once loaded)) and the outcome
(``outcome``: the finish reason or ``error``/``abort``,
``ttft_s``, ``tier`` the adapter was leased from, ``latency_s``, and ``engine``: the engine's
timeline of the request, ``ENGINE_FIELDS``, or null where the engine returned none).
``output_tokens`` is what was
generated when the request finished by ``stop``/``length``, and what it asked for (its
``max_tokens``) otherwise: a replay then asks for the same work. It holds nothing the operator
does not already see on /metrics and /admin (tenant names, adapter refs): no prompt, no text,
no key, no session. Lines are appended under a lock (one ``write`` each), so concurrent
requests never interleave within a line. Torch-free.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loraplex.engine.trace_log import EngineTrace

FINISHED = ("stop", "length")  # outcomes whose generated count is the request's whole output
RESUME_TAIL_BYTES = 64 * 1024  # the end of an existing log read at start (many whole lines)
# The ``engine`` object: seconds after the engine received the request (its own clock), null
# where it did not happen. ``asked_s``: its lease was asked for (a step's start); ``ready_s``: a
# deferred lease's load completed (null: granted at once); ``lease_s``: the lease
# was collected (a step's start; at once for an adapter in a GPU slot); ``scheduled_s``: the plan
# of the first step that carried it; ``first_step_end_s``: that step ended (its first token,
# unless its prompt was chunked); ``end_s``: it ended there. ``load_s``: the load's stage
# seconds summed (0: none), ``room_wait_s``: its wait for room in a tier. So ``ttft_s`` less
# ``first_step_end_s`` is the front, the two hops and the token's way out.
ENGINE_FIELDS = (
    "asked_s",
    "ready_s",
    "lease_s",
    "scheduled_s",
    "first_step_end_s",
    "end_s",
    "load_s",
    "room_wait_s",
)


@dataclass(frozen=True)
class LoggedRequest:
    """What the log records of one request."""

    arrived_s: float  # monotonic arrival time (the log writes it relative to its opening)
    tenant: str  # the requesting tenant's name
    revision: str | None  # ``tenant/name@revision`` that answered; None: the base model
    prompt_tokens: int  # prompt length in tokens
    max_tokens: int  # what it asked for
    completion_tokens: int  # what was generated
    outcome: str  # the finish reason, "error" or "abort"
    ttft_s: float | None  # arrival to first token; None: no token came
    tier: str | None  # the tier its adapter was leased from; None: base model or unknown
    latency_s: float  # arrival to the end
    engine: EngineTrace | None = None  # the engine's stages; None: it returned none
    rank: int | None = None  # the revision's largest rank; None: base model or unknown
    size_bytes: int | None = None  # its bytes once loaded; None: base model or unknown


def engine_timeline(trace: EngineTrace) -> dict[str, float | None]:
    """The ``engine`` object of a line (``ENGINE_FIELDS``), in seconds rounded to the µs."""
    first = trace.batches[0].start_offset_s if trace.batches else None
    lease, deferred = trace.leased_offset_s, trace.deferred_s
    values = {
        "asked_s": None if lease is None else lease - (deferred or 0.0),
        "ready_s": trace.ready_offset_s,
        "lease_s": trace.leased_offset_s,
        "scheduled_s": trace.queue_s,
        "first_step_end_s": first,
        "end_s": trace.end_offset_s,
        "load_s": math.fsum(s for _, s in trace.load_stages),
        "room_wait_s": trace.room_wait_s,
    }
    return {k: None if v is None else round(v, 6) for k, v in values.items()}


def check_log_path(path: Path) -> None:
    """ValueError naming ``request_log_path`` when its directory does not exist or the file
    cannot be opened for appending (it is created if absent, never truncated)."""
    if not path.parent.is_dir():
        raise ValueError(f"request_log_path {path} is invalid; its directory does not exist")
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(
            f"request_log_path {path} is invalid; it cannot be appended to: {reason}"
        ) from exc


def resume_offset_s(path: Path, wall_s: float) -> float:
    """Where an existing log's timeline goes on: the latest end (``t_s + latency_s``) among the
    whole lines of its last ``RESUME_TAIL_BYTES``, plus the wall time since the file was last
    written (the downtime, as the file's clock saw it); 0 for an absent or empty log, or one
    whose tail holds no line of this format.

    NOTE: ``t_s`` counted from each start, so a log appended by a restarted server went back to
    0 and a replay (``sim run --trace``, ``plan``) laid the runs over one another, in silence."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            f.seek(max(0, size - RESUME_TAIL_BYTES))
            tail = f.read()
        written_s = os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0
    ends = [_end_s(line) for line in tail.split(b"\n")[1 if size > len(tail) else 0 :]]
    found = [end for end in ends if end is not None]
    return 0.0 if not found else max(found) + max(0.0, wall_s - written_s)


def _end_s(line: bytes) -> float | None:
    """A line's end on the log's timeline, None for what is not a whole line of this format."""
    try:
        body = json.loads(line)
        end = float(body["t_s"]) + float(body["latency_s"])
    except (ValueError, TypeError, KeyError):
        return None
    return end if math.isfinite(end) and end >= 0.0 else None


class RequestLog:
    """Appends finished requests to ``path`` (created if absent, never truncated). A log that
    already holds lines is continued: its ``t_s`` go on from where the last run's ended, with
    the real gap between, so one file replays as one timeline across restarts."""

    def __init__(
        self,
        path: Path,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        check_log_path(path)  # an unwritable path fails at start, not at the first request
        self.path = path
        self._opened_s = clock() - resume_offset_s(path, wall())
        self._lock = threading.Lock()

    def line(self, request: LoggedRequest) -> str:
        adapter = None
        if request.revision is not None:
            owner, _, own_name = request.revision.partition("/")
            # another tenant's (public) adapter keeps its owner: the model string a replay sends
            adapter = own_name if owner == request.tenant and own_name else request.revision
        finished = request.outcome in FINISHED
        body = {
            "t_s": round(max(0.0, request.arrived_s - self._opened_s), 6),
            "tenant": request.tenant,
            "adapter": adapter,
            "prompt_tokens": max(1, request.prompt_tokens),
            "output_tokens": max(1, request.completion_tokens if finished else request.max_tokens),
            "outcome": request.outcome,
            "ttft_s": None if request.ttft_s is None else round(request.ttft_s, 6),
            "tier": request.tier,
            "latency_s": round(request.latency_s, 6),
            "engine": None if request.engine is None else engine_timeline(request.engine),
        }
        if adapter is not None and request.rank is not None and request.size_bytes is not None:
            # the simulator's shape fields: without them every adapter replayed at its default
            # rank and bytes per rank (a rank-128 adapter as 1 MiB; newop4)
            body.update(rank=request.rank, size_bytes=request.size_bytes)
        return json.dumps(body, sort_keys=True) + "\n"

    def write(self, request: LoggedRequest) -> None:
        text = self.line(request)
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(text)
