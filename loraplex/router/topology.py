"""Fleet topology for ``auto`` modes (issue 28, "topology"): dedicate one replica to a revision
whose work would saturate the others, and give it back when that revision cools down.

With ``share`` the top revision's fraction of the tokens routed over the last ``window_s`` and
``N`` the replicas with a fresh report, ``demand = share * N`` is that revision's work in
replicas' worth. At ``demand >= dedicate_demand`` (1.0: it would fill a whole replica of its
own), on a window of at least ``min_requests`` routed requests, one replica is asked to merge
it (``merged`` mode there: its tokens run with no LoRA work) and the router steers its traffic
there (``Router.dedication``: the merged bonus before the merge lands). Below
``release_demand`` the replica is released; the band between the two, and no change within
``min_dwell_s`` of the last, are the hysteresis. The replica chosen is one that already merged
the revision, else one holding it in GPU slots, else the least loaded; ties go to the lower id.

``decide_topology`` is pure (the simulator can reuse it); ``FleetTopology`` counts the routed
tokens, applies decisions and asks replicas through an injected callback. Torch-free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from loraplex.clock import Clock
from loraplex.router.config import check_non_negative_numbers
from loraplex.router.decision import RouteRequest
from loraplex.router.reports import ReplicaReport


@dataclass(frozen=True)
class TopologyConfig:
    """When one replica is dedicated to a revision (the module docstring)."""

    window_s: float = 30.0  # routed tokens counted over this many seconds
    dedicate_demand: float = 1.0  # top revision's work in replicas' worth that dedicates one
    release_demand: float = 0.6  # below this the dedicated replica is given back
    min_dwell_s: float = 60.0  # no change within this many seconds of the last one
    min_replicas: int = 2  # a fleet with fewer reporting replicas dedicates none
    # a window of fewer routed requests makes no dedication (its shares are a few draws: on a
    # fresh fleet the first request alone read as a share of 1.0 and dedicated a replica)
    min_requests: int = 16

    def __post_init__(self) -> None:
        check_non_negative_numbers(self)
        if self.window_s <= 0:
            raise ValueError(f"window_s {self.window_s} is invalid; expected > 0")
        if not self.release_demand < self.dedicate_demand:
            raise ValueError(
                f"release_demand {self.release_demand} is invalid; expected < dedicate_demand "
                f"({self.dedicate_demand}), or a dedication would flap"
            )
        if not isinstance(self.min_replicas, int) or self.min_replicas < 2:
            raise ValueError(f"min_replicas {self.min_replicas!r} is invalid; expected >= 2")
        if not isinstance(self.min_requests, int) or self.min_requests < 1:
            raise ValueError(f"min_requests {self.min_requests!r} is invalid; expected >= 1")


@dataclass(frozen=True)
class Dedication:
    """One replica asked to run one revision merged."""

    replica_id: str  # the replica asked to merge it
    adapter_key: str  # the revision (``str(AdapterKey)``, as in routing reports)


def decide_topology(
    current: Dedication | None,
    since_change_s: float | None,
    shares: Mapping[str, float],
    reports: Mapping[str, ReplicaReport | None],
    config: TopologyConfig,
    *,
    num_requests: int | None = None,
) -> Dedication | None:
    """The dedication wanted now. ``since_change_s``: seconds since the last change (None:
    never changed); ``shares``: revision -> its fraction of the window's routed tokens;
    ``reports``: replica id -> fresh report (None: none, that replica does not count);
    ``num_requests``: the routed requests behind ``shares`` (None: enough); below
    ``min_requests`` no dedication is made (one may still be given back)."""
    live = {rid: r for rid, r in reports.items() if r is not None}
    if current is not None and current.replica_id not in live:
        current, since_change_s = None, None  # its replica is gone: no dwell to respect
    if len(live) < config.min_replicas:
        return None
    if since_change_s is not None and since_change_s < config.min_dwell_s:
        return current
    num_replicas = len(live)
    kept = current is not None and (
        shares.get(current.adapter_key, 0.0) * num_replicas >= config.release_demand
    )
    if kept:
        return current
    if num_requests is not None and num_requests < config.min_requests:
        return None  # too few requests to make one (giving one back is the safe side)
    top = min(shares, key=lambda k: (-shares[k], k), default=None)
    if top is None or shares[top] * num_replicas < config.dedicate_demand:
        return None
    return Dedication(_pick(top, live), top)


def _pick(adapter_key: str, live: Mapping[str, ReplicaReport]) -> str:
    """Already merged there, else in its GPU slots, else the least loaded; then the lower id."""

    def rank(replica_id: str) -> tuple[int, int, str]:
        report = live[replica_id]
        held = 0 if adapter_key in report.residency.merged else 1
        held += 0 if adapter_key in report.residency.l0 else 1
        return (held, report.load.num_active_tokens + report.load.num_queued, replica_id)

    return min(live, key=rank)


class FleetTopology:
    """Counts routed tokens per revision and keeps at most one replica dedicated.

    ``ask(replica_id, adapter_key)`` asks a replica to merge a revision (None: to go back to
    its own mode); it is called on every change, the old replica first."""

    def __init__(
        self,
        config: TopologyConfig,
        clock: Clock,
        ask: Callable[[str, str | None], None],
    ) -> None:
        self.config = config
        self._clock = clock
        self._ask = ask
        self._routed: deque[tuple[float, str | None, int]] = deque()  # (at_s, key, tokens)
        self._tokens: dict[str, int] = {}  # revision -> its tokens in ``_routed``
        self._total = 0  # all tokens in ``_routed``, base-model ones included
        self.dedication: Dedication | None = None
        self._changed_s: float | None = None
        self.num_changes = 0  # dedications made or given back (a flap counter)

    def record(self, request: RouteRequest) -> tuple[float, str | None, int]:
        """One routed request's prompt tokens (at least 1: every request is work); returns its
        entry, for ``withdraw``."""
        now_s = self._clock.now()
        key, tokens = request.adapter_key, max(1, request.num_prompt_tokens)
        entry = (now_s, key, tokens)
        self._routed.append(entry)
        self._count(key, tokens)
        self._expire(now_s)
        return entry

    def withdraw(self, entry: tuple[float, str | None, int]) -> None:
        """Uncounts a recorded request that never had a first token (refused, cancelled, its
        replica lost): only admitted work weighs toward a dedication. A no-op once it left
        the window. NOTE: O(requests in the window)."""
        try:
            self._routed.remove(entry)
        except ValueError:
            return
        self._count(entry[1], -entry[2])

    def shares(self) -> dict[str, float]:
        """Each revision's fraction of the window's routed tokens (base-model tokens count in
        the total, so the shares may sum below 1)."""
        self._expire(self._clock.now())
        return {key: tokens / self._total for key, tokens in self._tokens.items()}

    def update(self, reports: Mapping[str, ReplicaReport | None]) -> Dedication | None:
        """Decides on ``reports`` now; asks the replicas concerned when the dedication changes."""
        now_s = self._clock.now()
        since = None if self._changed_s is None else now_s - self._changed_s
        shares = self.shares()  # expires the window first
        wanted = decide_topology(
            self.dedication, since, shares, reports, self.config, num_requests=len(self._routed)
        )
        if wanted != self.dedication:
            old, self.dedication = self.dedication, wanted
            self._changed_s = now_s
            self.num_changes += 1
            if old is not None and (wanted is None or old.replica_id != wanted.replica_id):
                self._ask(old.replica_id, None)
            if wanted is not None:
                self._ask(wanted.replica_id, wanted.adapter_key)
        return self.dedication

    def _count(self, key: str | None, tokens: int) -> None:
        self._total += tokens
        if key is not None:
            left = self._tokens.get(key, 0) + tokens
            if left:
                self._tokens[key] = left
            else:
                del self._tokens[key]

    def _expire(self, now_s: float) -> None:
        while self._routed and now_s - self._routed[0][0] > self.config.window_s:
            _, key, tokens = self._routed.popleft()
            self._count(key, -tokens)
