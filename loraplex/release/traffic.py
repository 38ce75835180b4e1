"""Live traffic of the revisions under release: what the release controller compares.

Only the candidate and the baseline (stable) revision of an active release are recorded, so
memory is bounded by what is being released, not by the number of adapters: the tracked set
comes from ``source`` (the registry's active releases), re-read by ``refresh`` at most once per
``refresh_s`` from the release thread (never from the event loop: it reads the database); a
revision that leaves the set loses its samples and its metric series. Per revision a ring keeps
the newest ``max_samples`` outcomes and ``max_samples`` feedback ratings.

What counts against a revision (``classify``):

- ``ok``: the request finished (``stop`` / ``length``);
- ``error``: the service failed it: the model's generation failure (non-finite logits,
  ``GenerationError.model_fault``), the revision's load failing
  (adapter errors, a cancelled load, an adapter too large for any tier), the engine being down,
  a queue timeout (a 503: a candidate that loads slowly keeps its callers waiting), and any
  unexpected exception (a 500);
- ``excluded`` (not counted at all): what the client caused or was told to retry: the client
  going away (``abort``), invalid input and a prompt too long (400), queue full and rate limits
  (429: load shedding shared by every revision), and a generation failure its own sampling
  values caused (a ``GenerationError`` whose ``model_fault`` is False).

Each sample carries its caller (``caller_key``), so a window can leave out the callers that push
a figure most either way: one tenant's requests alone never decide a release
(``release/callers.py``, ``release/compare.py``).

Times are the release clock's (the controller's ``Clock``), stamped when a request finishes.
Torch-free.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from loraplex.clock import Clock
from loraplex.errors import (
    AdapterNotFoundError,
    AuthenticationError,
    GenerationError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
    RateLimitError,
)
from loraplex.release.callers import extremes, p99_without_extremes
from loraplex.release.model import Release, RevisionWindow
from loraplex.sampling import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP

COUNTED_MOVES = 1024  # the latest (release, state) moves remembered so none is counted twice

_log = logging.getLogger(__name__)
CANDIDATE = "candidate"  # the revision being released
BASELINE = "baseline"  # the stable revision it is compared with

# Errors the client caused, or load shedding it is told to retry: never a revision's fault.
_CLIENT_ERRORS = (
    AdapterNotFoundError,
    AuthenticationError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
    RateLimitError,
)


class Verdict(StrEnum):
    OK = "ok"
    ERROR = "error"
    EXCLUDED = "excluded"


def classify(outcome: str, error: BaseException | None) -> Verdict:
    """A finished request's verdict for its revision (see the module docstring).
    ``outcome``: the finish reason, or "error" when the stream raised ``error``."""
    if outcome in (FINISH_STOP, FINISH_LENGTH):
        return Verdict.OK
    if outcome == FINISH_ABORT or isinstance(error, _CLIENT_ERRORS):
        return Verdict.EXCLUDED
    if isinstance(error, GenerationError) and not error.model_fault:
        return Verdict.EXCLUDED  # the request's own sampling values broke its row
    return Verdict.ERROR


def caller_key(revision: str, tenant: str, sticky_key: str | None, fallback: str) -> str:
    """Whose voice a request of ``revision`` (tenant/name@rev) is when a release is judged.
    Another tenant than the alias's owner is one caller however many users or sessions it
    names (it can invent any number); the owner's requests are told apart by ``sticky_key``
    (its ``user`` / ``X-Session-Id``), else each (``fallback``: unique per request) stands alone."""
    if tenant != revision.partition("/")[0]:
        return f"tenant:{tenant}"
    return f"owner:{sticky_key}" if sticky_key else f"request:{fallback}"


@dataclass(frozen=True)
class TrackedRevision:
    """A revision whose traffic is recorded: a release's candidate or its baseline."""

    ref: str  # tenant/name@revision
    release_id: str  # the release it belongs to
    role: str  # CANDIDATE or BASELINE
    state: str  # the release's state (``ReleaseState`` value), for the state gauge

    @property
    def adapter(self) -> str:
        return self.ref.partition("@")[0]

    @property
    def revision(self) -> str:
        return self.ref.partition("@")[2]


def tracked_revisions(releases: Iterable[Release]) -> list[TrackedRevision]:
    """The candidate and baseline of every release in flight (finished ones are not tracked,
    even while their baseline is still held)."""
    tracked = []
    for release in releases:
        if release.terminal:
            continue
        state = release.state.value
        tracked.append(TrackedRevision(release.candidate_ref, release.release_id, CANDIDATE, state))
        tracked.append(TrackedRevision(release.baseline_ref, release.release_id, BASELINE, state))
    return tracked


T = TypeVar("T")


def _newest(ring: deque[T], recent: Callable[[T], bool]) -> list[T]:
    """The entries at the end of ``ring`` (recording order) for which ``recent`` holds, oldest
    first; the scan stops at the first older one."""
    found: list[T] = []
    for entry in reversed(ring):
        if not recent(entry):
            break
        found.append(entry)
    found.reverse()
    return found


@dataclass(frozen=True)
class Sample:
    """One finished request."""

    at_s: float  # release-clock time it finished
    ok: bool  # False: an error (excluded requests are not sampled)
    ttft_s: float | None  # arrival to first token; None: no token
    tpot_s: float | None  # mean seconds per output token after the first; None: < 2 tokens
    caller: str = ""  # ``caller_key`` of who asked


@dataclass(frozen=True)
class Rating:
    """One client rating of a request of the revision."""

    served_at_s: float  # release-clock time the rated request started
    good: bool
    caller: str = ""  # ``caller_key`` of the rated request
    rated_at_s: float = 0.0  # release-clock time the rating arrived (never before served_at_s)


@dataclass
class RevisionTotals:
    """Counts since the revision was first tracked (the metric counters)."""

    ok: int = 0
    error: int = 0
    good: int = 0
    bad: int = 0


class _Ring:
    def __init__(self, max_samples: int) -> None:
        self.samples: deque[Sample] = deque(maxlen=max_samples)
        self.ratings: deque[Rating] = deque(maxlen=max_samples)
        self.totals = RevisionTotals()


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in (0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n * q), at least 1
    return ordered[int(rank) - 1]


class ReleaseTraffic:
    """Per-revision outcome rings of the revisions under release (see the module docstring)."""

    def __init__(
        self,
        clock: Clock,
        source: Callable[[], Iterable[TrackedRevision]],
        *,
        max_samples: int = 20_000,
        max_tracked: int = 256,
        refresh_s: float = 1.0,
    ) -> None:
        if max_samples < 1 or max_tracked < 1:
            raise ValueError(
                f"max_samples {max_samples} / max_tracked {max_tracked} is invalid; expected >= 1"
            )
        self.clock = clock
        self._source = source
        self._max_samples = max_samples
        self._max_tracked = max_tracked
        self._refresh_s = refresh_s
        self._refreshed_s: float | None = None
        self._lock = threading.Lock()
        self._tracked: dict[str, TrackedRevision] = {}
        self._rings: dict[str, _Ring] = {}
        self._transitions: Counter[str] = Counter()  # release state -> moves into it
        self._counted: deque[tuple[str, str]] = deque(maxlen=COUNTED_MOVES)  # (release, state)

    def count_transition(self, state: str, release_id: str | None = None) -> None:
        """One release moved into ``state`` (a ``ReleaseState`` value), by the controller or an
        operator: ``loraplex_release_transitions_total`` (rollbacks are alerted on). A move of
        ``release_id`` already counted is not counted again: an operator's move through this
        server's admin API is counted by the route and then seen by the controller."""
        with self._lock:
            if release_id is not None:
                if (release_id, state) in self._counted:
                    return
                self._counted.append((release_id, state))
            self._transitions[state] += 1

    def transitions(self) -> dict[str, int]:
        """Moves into each release state since the server started."""
        with self._lock:
            return dict(self._transitions)

    def refresh(self, *, force: bool = False) -> None:
        """Re-reads the tracked set from ``source`` unless it was read less than ``refresh_s``
        ago. Blocking (a database read): call it off the event loop."""
        now = self.clock.now()
        last = self._refreshed_s
        if not force and last is not None and now - last < self._refresh_s:
            return
        self._refreshed_s = now
        self.set_tracked(self._source())

    def set_tracked(self, revisions: Iterable[TrackedRevision]) -> None:
        """Tracks exactly ``revisions`` (the first ``max_tracked``; the rest is logged)."""
        wanted: dict[str, TrackedRevision] = {}
        for revision in revisions:
            if len(wanted) == self._max_tracked and revision.ref not in wanted:
                _log.warning("release traffic: %s not tracked (max_tracked)", revision.ref)
                continue
            wanted[revision.ref] = revision
        with self._lock:
            self._tracked = wanted
            self._rings = {ref: self._rings.get(ref) or _Ring(self._max_samples) for ref in wanted}

    def is_tracked(self, ref: str | None) -> bool:
        with self._lock:
            return ref is not None and ref in self._tracked

    def tracked(self) -> list[TrackedRevision]:
        with self._lock:
            return list(self._tracked.values())

    def record(
        self,
        ref: str,
        verdict: Verdict,
        ttft_s: float | None,
        tpot_s: float | None,
        caller: str = "",
    ) -> float | None:
        """Records a finished request of ``ref`` by ``caller``; returns its time, None if it
        is not tracked or the verdict excludes it."""
        if verdict is Verdict.EXCLUDED:
            return None
        with self._lock:
            ring = self._rings.get(ref)
            if ring is None:
                return None
            at_s = self.clock.now()
            ring.samples.append(Sample(at_s, verdict is Verdict.OK, ttft_s, tpot_s, caller))
            if verdict is Verdict.OK:
                ring.totals.ok += 1
            else:
                ring.totals.error += 1
            return at_s

    def record_feedback(self, ref: str, served_at_s: float, good: bool, caller: str = "") -> bool:
        """Counts a client's rating of a request ``ref`` served at ``served_at_s``; False (not
        counted) when ``ref`` is not under release any more."""
        with self._lock:
            ring = self._rings.get(ref)
            if ring is None:
                return False
            ring.ratings.append(Rating(served_at_s, good, caller, self.clock.now()))
            if good:
                ring.totals.good += 1
            else:
                ring.totals.bad += 1
            return True

    def window(self, ref: str, since_s: float) -> RevisionWindow:
        """``ref``'s requests that finished at or after ``since_s`` (and the ratings of
        requests served since then); empty when ``ref`` is not tracked."""
        with self._lock:
            ring = self._rings.get(ref)
            if ring is None:
                return RevisionWindow()
            # NOTE: both rings are in recording order, so the newest entries are scanned back to
            # ``since_s`` only (a step's window is seconds; a stable revision's ring holds up to
            # ``max_samples``): a rating recorded before ``since_s`` was served before it too.
            samples = _newest(ring.samples, lambda s: s.at_s >= since_s)
            ratings = [
                r
                for r in _newest(ring.ratings, lambda r: r.rated_at_s >= since_s)
                if r.served_at_s >= since_s
            ]
        ttfts = [s.ttft_s for s in samples if s.ok and s.ttft_s is not None]
        tpots = [s.tpot_s for s in samples if s.ok and s.tpot_s is not None]
        worst, best = extremes((s.caller, not s.ok) for s in samples)
        worst_rater, best_rater = extremes((r.caller, not r.good) for r in ratings)
        ttft_judged = p99_without_extremes(
            [(s.ttft_s, s.caller) for s in samples if s.ok and s.ttft_s is not None]
        )
        tpot_judged = p99_without_extremes(
            [(s.tpot_s, s.caller) for s in samples if s.ok and s.tpot_s is not None]
        )
        bad = sum(1 for r in ratings if not r.good)
        return RevisionWindow(
            requests=len(samples),
            errors=sum(1 for s in samples if not s.ok),
            ttft_p50_s=percentile(ttfts, 0.5),
            ttft_p99_s=percentile(ttfts, 0.99),
            tpot_p50_s=percentile(tpots, 0.5),
            tpot_p99_s=percentile(tpots, 0.99),
            good=len(ratings) - bad,
            bad=bad,
            ttft_samples=len(ttfts),
            tpot_samples=len(tpots),
            callers=len({s.caller for s in samples}),
            top_caller_requests=worst.events,
            top_caller_errors=worst.failures,
            top_rater_good=worst_rater.events - worst_rater.failures,
            top_rater_bad=worst_rater.failures,
            best_caller_requests=best.events,
            best_caller_errors=best.failures,
            best_rater_good=best_rater.events - best_rater.failures,
            best_rater_bad=best_rater.failures,
            ttft_p99_judged_s=ttft_judged[0],
            ttft_judged_samples=ttft_judged[1],
            tpot_p99_judged_s=tpot_judged[0],
            tpot_judged_samples=tpot_judged[1],
        )

    def totals(self) -> list[tuple[TrackedRevision, RevisionTotals]]:
        """Every tracked revision with a copy of its counters (for /metrics)."""
        with self._lock:
            return [
                (tracked, RevisionTotals(**vars(self._rings[ref].totals)))
                for ref, tracked in self._tracked.items()
            ]
