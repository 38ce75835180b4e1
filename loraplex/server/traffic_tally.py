"""``TrafficTally``: requests and tokens per tenant class and per revision since the last drain.

The live page's history (``server/history.py``) drains it once per sample, so each sample holds
one interval's traffic. Tenant classes are the registry's priority classes (a fixed set). Revision
names are the tenant's choice, so they are bounded twice: within one interval at most
``max_tracked`` revisions are counted by name (later ones count under ``OTHER``), and a drained
interval keeps only its ``top_n`` revisions by tokens (then requests, then name), the rest summed
as one "other" entry. Counts always add up to every request finished in the interval.

Thread-safe: requests finish on the event loop, the sampler drains on its own thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

OTHER = "__other__"  # the revisions counted without a name of their own
BASE_MODEL = "(base model)"  # requests that named no adapter
ERROR_OUTCOMES = frozenset(("error",))  # outcomes counted as failures in the class view


@dataclass(frozen=True)
class Traffic:
    """Requests finished and tokens generated (by one class or revision, in one interval)."""

    requests: int  # requests that finished
    tokens: int  # tokens they generated
    errors: int = 0  # of the requests, those that failed

    def plus(self, other: Traffic) -> Traffic:
        return Traffic(
            self.requests + other.requests,
            self.tokens + other.tokens,
            self.errors + other.errors,
        )

    def to_json(self) -> dict[str, int]:
        return {"requests": self.requests, "tokens": self.tokens, "errors": self.errors}


NO_TRAFFIC = Traffic(0, 0, 0)


@dataclass(frozen=True)
class RevisionTraffic:
    """One named revision's traffic in an interval."""

    revision: str  # tenant/name@revision, or ``BASE_MODEL``
    traffic: Traffic

    def to_json(self) -> dict[str, object]:
        return {"revision": self.revision, **self.traffic.to_json()}


@dataclass(frozen=True)
class TrafficInterval:
    """What the tally counted between two drains."""

    classes: dict[str, Traffic]  # priority class -> traffic (classes without any left out)
    top_revisions: tuple[RevisionTraffic, ...]  # at most ``top_n``, most tokens first
    other_revisions: Traffic  # every revision not in ``top_revisions``, summed
    num_other_revisions: int  # how many revisions (``OTHER`` counts as one) that sum holds

    def to_json(self) -> dict[str, object]:
        return {
            "classes": {name: t.to_json() for name, t in sorted(self.classes.items())},
            "top_revisions": [r.to_json() for r in self.top_revisions],
            "other_revisions": {
                **self.other_revisions.to_json(),
                "num_revisions": self.num_other_revisions,
            },
        }


class TrafficTally:
    """Per-class and per-revision counts of the requests finished since the last ``drain``."""

    def __init__(self, max_tracked: int = 1024, top_n: int = 8) -> None:
        if max_tracked < 1 or top_n < 1:
            raise ValueError(
                f"max_tracked {max_tracked} / top_n {top_n} is invalid; expected >= 1 / >= 1"
            )
        self._max_tracked = max_tracked
        self._top_n = top_n
        self._lock = threading.Lock()
        self._classes: dict[str, Traffic] = {}
        self._revisions: dict[str, Traffic] = {}

    def record(self, priority_class: str, revision: str | None, tokens: int, outcome: str) -> None:
        """One finished request of a ``priority_class`` tenant (``revision`` None: the base
        model) that generated ``tokens`` and ended with ``outcome``."""
        one = Traffic(1, max(0, tokens), 1 if outcome in ERROR_OUTCOMES else 0)
        name = BASE_MODEL if revision is None else revision
        with self._lock:
            self._classes[priority_class] = self._classes.get(priority_class, NO_TRAFFIC).plus(one)
            if name not in self._revisions and len(self._revisions) >= self._max_tracked:
                name = OTHER
            self._revisions[name] = self._revisions.get(name, NO_TRAFFIC).plus(one)

    def drain(self) -> TrafficInterval:
        """The counts since the last drain (which start again from zero)."""
        with self._lock:
            classes, revisions = self._classes, self._revisions
            self._classes, self._revisions = {}, {}
        named = sorted(
            ((name, t) for name, t in revisions.items() if name != OTHER),
            key=lambda item: (-item[1].tokens, -item[1].requests, item[0]),
        )
        top = tuple(RevisionTraffic(name, t) for name, t in named[: self._top_n])
        rest = [t for _, t in named[self._top_n :]]
        if OTHER in revisions:
            rest.append(revisions[OTHER])
        other = NO_TRAFFIC
        for traffic in rest:
            other = other.plus(traffic)
        return TrafficInterval(classes, top, other, len(rest))
