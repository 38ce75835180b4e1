"""The short load test: the deployment's hot adapters under steady traffic, then a burst over the
long tail (every other registered adapter once, all at once) while the hot traffic goes on.

Bounded on every side: ``load_s`` of wall time, ``concurrency`` workers, ``max_requests`` in
all, ``max_tokens`` per answer. Each request is recorded with the revision and digest that
answered, so a check can compare them with the registry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from loraplex.preflight.client import Deployment, PreflightError

PROMPT = "Preflight check:"
MAX_LOAD_S = 600.0


@dataclass(frozen=True)
class LoadConfig:
    """How much load the preflight may put on the deployment."""

    load_s: float = 6.0  # wall time of the whole test (hot phase, then hot plus burst)
    concurrency: int = 4  # requests in flight at once for the hot traffic
    max_tokens: int = 4  # tokens per answer
    max_requests: int = 2000  # requests in all, whatever the time left

    def __post_init__(self) -> None:
        if not 0 < self.load_s <= MAX_LOAD_S:
            raise ValueError(f"load_s {self.load_s} is invalid; expected in (0, {MAX_LOAD_S}]")
        if not 1 <= self.concurrency <= 64:
            raise ValueError(f"concurrency {self.concurrency} is invalid; expected 1-64")
        if not 1 <= self.max_tokens <= 64:
            raise ValueError(f"max_tokens {self.max_tokens} is invalid; expected 1-64")
        if self.max_requests < 1:
            raise ValueError(f"max_requests {self.max_requests} is invalid; expected >= 1")


@dataclass(frozen=True)
class Target:
    """An adapter the load test calls, with what the registry says must answer."""

    model: str  # ``tenant/name``
    key: str  # a key of the owning tenant
    digests: dict[str, str]  # revision ref -> adapter digest, for the alias's revisions


@dataclass(frozen=True)
class Outcome:
    """One load-test request."""

    model: str  # the adapter asked
    phase: str  # "hot" or "tail"
    status: int  # HTTP status (0: no answer)
    latency_s: float  # send to full answer
    revision: str | None  # the revision that answered (``loraplex.revision``)
    digest: str | None  # its adapter digest (``loraplex.adapter_digest``)
    error: str | None  # the error body's message, if any

    def mismatch(self, target: Target) -> str | None:
        """Why this answer is not one the registry allows (None: it is)."""
        if self.status != 200:
            return None
        if self.revision not in target.digests:
            return f"{self.model} answered by {self.revision}, not one of {sorted(target.digests)}"
        if target.digests[self.revision] != self.digest:
            return f"{self.revision} answered with digest {self.digest}, registry has another"
        return None


@dataclass(frozen=True)
class LoadResult:
    """Everything the load test saw."""

    outcomes: tuple[Outcome, ...]  # every request, in completion order
    hot: tuple[Target, ...]  # the hot set
    tail: tuple[Target, ...]  # the long tail
    wall_s: float  # how long it ran

    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200]

    def mismatches(self) -> list[str]:
        targets = {t.model: t for t in (*self.hot, *self.tail)}
        found = (o.mismatch(targets[o.model]) for o in self.outcomes)
        return [m for m in found if m is not None]

    def distinct_models(self) -> int:
        return len({o.model for o in self.outcomes if o.status == 200})

    def summary(self) -> dict[str, Any]:
        def p(phase: str, q: float) -> float | None:
            values = sorted(
                o.latency_s for o in self.outcomes if o.phase == phase and o.status == 200
            )
            if not values:
                return None
            return round(values[min(len(values) - 1, int(q * len(values)))], 4)

        statuses: dict[str, int] = {}
        for outcome in self.outcomes:
            statuses[str(outcome.status)] = statuses.get(str(outcome.status), 0) + 1
        return {
            "requests": len(self.outcomes),
            "statuses": statuses,
            "hot_adapters": len(self.hot),
            "tail_adapters": len(self.tail),
            "distinct_adapters_answered": self.distinct_models(),
            "hot_p50_s": p("hot", 0.5),
            "hot_p99_s": p("hot", 0.99),
            "tail_p50_s": p("tail", 0.5),
            "tail_p99_s": p("tail", 0.99),
            "wall_s": round(self.wall_s, 3),
        }


def one_request(deployment: Deployment, target: Target, phase: str, max_tokens: int) -> Outcome:
    body = {"model": target.model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    started = time.monotonic()
    try:
        answer = deployment.call("POST", "/v1/completions", target.key, body)
    except PreflightError as exc:
        return Outcome(target.model, phase, 0, time.monotonic() - started, None, None, str(exc))
    latency_s = time.monotonic() - started
    data = answer.body if isinstance(answer.body, dict) else {}
    served = data.get("loraplex") or {}
    error = None if answer.ok() else str((data.get("error") or {}).get("message", answer.body))
    return Outcome(
        target.model, phase, answer.status, latency_s,
        served.get("revision"), served.get("adapter_digest"), error,
    )  # fmt: skip


class _Budget:
    """The requests left (shared by the workers)."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True


def run_load(
    deployment: Deployment,
    hot: list[Target],
    tail: list[Target],
    config: LoadConfig,
    clock: Callable[[], float] = time.monotonic,
) -> LoadResult:
    """Hot traffic for ``load_s``; the tail burst starts half way through."""
    if not hot:
        raise PreflightError("no adapter to load-test: the registry lists none")
    started = clock()
    deadline = started + config.load_s
    budget = _Budget(config.max_requests)
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def record(outcome: Outcome) -> None:
        with lock:
            outcomes.append(outcome)

    def hot_worker(index: int) -> None:
        count = index
        while clock() < deadline and budget.take():
            target = hot[count % len(hot)]
            record(one_request(deployment, target, "hot", config.max_tokens))
            count += config.concurrency

    def tail_one(target: Target) -> None:
        if budget.take():
            record(one_request(deployment, target, "tail", config.max_tokens))

    burst_workers = max(1, min(len(tail), 2 * config.concurrency))
    with ThreadPoolExecutor(config.concurrency + burst_workers) as pool:
        workers = [pool.submit(hot_worker, i) for i in range(config.concurrency)]
        while clock() < started + config.load_s / 2:
            time.sleep(0.05)
        burst = [pool.submit(tail_one, target) for target in tail]
        for future in (*workers, *burst):
            future.result()
    return LoadResult(tuple(outcomes), tuple(hot), tuple(tail), clock() - started)
