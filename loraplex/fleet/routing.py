"""What the fleet's request router keeps in this process: decisions by reason (``ROUTING_LOG``,
read by the ingress's /metrics and ``/admin/fleet``), report stamping, and the mapping of a
handle call to the policy's ``RouteRequest``. Ray-free; ``ray_router`` holds only the Ray class
(Ray pickles that module by value, so it must not define state of its own).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from loraplex.engine.protocol import EngineRequest
from loraplex.fleet.report_cache import SEQ_KEY, DecodedReports
from loraplex.router.decision import RouteRequest
from loraplex.router.placement import rank_name
from loraplex.router.reports import MalformedReportError, ReplicaReport

_log = logging.getLogger(__name__)
REPORT_KEY = "report"  # the routing stats key holding the encoded report
UP_KEY = "up"  # the routing stats key saying whether the replica's engine takes requests
RANK_KEY = "rank"  # the routing stats key holding the replica's deployment rank (Ray Serve's)


class RoutingLog:
    """Decisions by reason since this process started, and the policy that made them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: Counter[str] = Counter()
        self.policy: str | None = None
        self.malformed_reports = 0  # reports this process refused (MalformedReportError)

    def record(self, reason: str) -> None:
        with self._lock:
            self._reasons[reason] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._reasons)


ROUTING_LOG = RoutingLog()


class TopologyAsks:
    """Where this process's request router sends ``FleetTopology``'s asks: the ingress sets
    ``send`` (``FleetMergeHolds.dedicate``, over its link) when it starts. An ask made before
    that, or in a process with no ingress (a benchmark driver), is counted and logged."""

    def __init__(self) -> None:
        self.send: Callable[[str, str | None], object] | None = None
        self.num_unsent = 0  # asks made with no ``send`` set

    def ask(self, replica_id: str, adapter_key: str | None) -> None:
        send = self.send
        if send is None:
            self.num_unsent += 1
            _log.warning(
                "topology: no ingress link to ask replica %s (%s)", replica_id, adapter_key
            )
            return
        send(replica_id, adapter_key)


TOPOLOGY_ASKS = TopologyAsks()


MAX_CALLS_REMEMBERED = 65536  # what ``FirstTries``, ``Unadmitted`` keep (least recent out first)
# requests ``Unadmitted`` keeps as withdrawn before the router counted them: the router's ask
# for one comes within milliseconds, or never (Ray skips a cancelled call it has not routed)
MAX_ENDED_REMEMBERED = 4096


class Unadmitted:
    """Generate requests this process's request router counted (``LoraplexRequestRouter``:
    its topology's count, and its decision, pending on the replica it was sent to) that have
    not ended yet, by (tenant, request id). The engine client (``engine_client.FleetEngineClient``)
    calls ``admitted`` at a request's first token, ``withdraw`` when an attempt ends without
    one, which undoes both (``FleetTopology.withdraw``, ``Router.withdraw``), and ``ended`` when
    a request that had its first token ends, which ends its decision (``Router.finish``: no
    longer load, still its revision's) and keeps the topology's count (served work).
    NOTE: a tenant's refused or cancelled requests otherwise weighed toward a dedication, and
    they and its finished ones stayed their replica's pending load until its next report.

    A request withdrawn before the router counted it is remembered as ended, and ``counted``
    then answers False (the caller undoes it at once) instead of keeping it. NOTE: Ray Serve
    routes on its own event loop: a request cancelled within milliseconds of being sent (its
    client left) was withdrawn here before the router's ask for it ran; the ask then kept an
    undo no one would call (holding the call, its prompt included, until
    ``MAX_CALLS_REMEMBERED`` newer ones pushed it out) and left its decision pending.

    The last ``MAX_CALLS_REMEMBERED`` counted and running ones are kept, and the last
    ``MAX_ENDED_REMEMBERED`` ended ones, least recent out first. A counted one pushed out stays
    counted (its decision until its replica's next report, at most ``recent_ttl_s``; its
    topology count for the topology's window): that takes more requests in flight at once than
    the ingress's connection bounds let in (``max_connections``, 1,024 by default). Not a
    tenant's lever: what filled it was the race above (8 of 3,000 requests whose client left
    6-8 ms after sending, on the demo fleet: docs/benchmarks/attackfleet2.md)."""

    def __init__(
        self, max_remembered: int = MAX_CALLS_REMEMBERED, max_ended: int = MAX_ENDED_REMEMBERED
    ) -> None:
        self._max = max_remembered
        self._max_ended = max_ended
        self._lock = threading.Lock()
        # before the first token: (undo, finish); after it, until the end: finish
        self._undo: OrderedDict[tuple[str, str], tuple[Callable[[], None], Callable[[], None]]]
        self._undo = OrderedDict()
        self._running: OrderedDict[tuple[str, str], Callable[[], None]] = OrderedDict()
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()  # withdrawn, uncounted

    def counted(
        self,
        tenant: str,
        request_id: str,
        undo: Callable[[], None],
        finish: Callable[[], None] | None = None,
    ) -> bool:
        """Keeps ``undo`` (and ``finish``, for the request's end) until the request's first
        token or its end; False (nothing kept) when the request was withdrawn already: the
        caller undoes what it counted itself."""
        key = (tenant, request_id)
        with self._lock:
            if key in self._ended:
                del self._ended[key]
                return False
            _remember(self._undo, key, (undo, finish or _nothing), self._max)
            return True

    def admitted(self, tenant: str, request_id: str) -> None:
        key = (tenant, request_id)
        with self._lock:
            kept = self._undo.pop(key, None)
            if kept is not None:
                _remember(self._running, key, kept[1], self._max)

    def withdraw(self, tenant: str, request_id: str) -> None:
        key = (tenant, request_id)
        with self._lock:
            kept = self._undo.pop(key, None)
            if kept is None:  # not counted yet (the router has not asked) or not at all
                _remember(self._ended, key, None, self._max_ended)
        if kept is not None:
            kept[0]()

    def ended(self, tenant: str, request_id: str) -> None:
        """A request ``admitted`` ended (answered, or cut after its first token)."""
        with self._lock:
            finish = self._running.pop((tenant, request_id), None)
        if finish is not None:
            finish()


def _remember(kept: OrderedDict[Any, Any], key: Any, value: Any, most: int) -> None:
    kept[key] = value
    kept.move_to_end(key)
    if len(kept) > most:
        kept.popitem(last=False)


def _nothing() -> None:
    pass


UNADMITTED = Unadmitted()


class FirstTries:
    """Which ``choose_replicas`` calls are a handle call's first, by Ray's internal request id,
    and where each call's last choice was remembered as pending (``Router.last_mark``).

    NOTE: Ray Serve asks ``choose_replicas`` again, at every backoff, for a call that none of the
    replicas offered took (each at its ``max_ongoing_requests``): one waiting request was routed
    tens of times, and each time counted again as routed work (``FleetTopology``'s shares, by
    which a tenant's waiting requests weighed as many requests as they had backoffs), as a
    decision (``ROUTING_LOG``) and as pending on the replica chosen that time (each looked
    busier until its next report). A call without an id (a test's) is always a first try. A
    call ``end`` saw withdrawn keeps no mark: Ray asks once more after its backoff sleep before
    it looks whether the call was cancelled, and that ask marked the call pending again, with no
    undo left to take it back.

    NOTE: the last ``MAX_CALLS_REMEMBERED`` calls asked about are kept, each moved to the end at
    every ask; a call that fell out would count as a first try again (counted twice in the
    topology and ``ROUTING_LOG``, pending on two replicas until the older decision lapses, at
    most ``recent_ttl_s``). One still asked about falls out only if 65,536 other calls get their
    first ask between two of its asks, which the request limits in docs/operations.md keep out
    of reach: Ray 2.60 asks about a call only while one of its routing tasks holds it (at most
    min(50, 2 x replicas) tasks per handle: in the ingress, its engine handle), again after each
    backoff (0.025 s doubling to 0.5 s) and queue-length probe (a deadline of at most 1 s), so
    about 1.5 s at most apart; a task takes a new call only once its previous one was placed on
    a replica or cancelled, so that would be over 40,000 calls placed or cancelled a second
    through one ingress, each part of an HTTP request it parsed and authenticated, where at most
    ``max_connections`` (1,024) requests of at most 16 engine requests each (16,384 calls) are
    in flight at once. Not bounded by that in-flight figure: ended calls stay here until pushed
    out (a withdrawn one must, for the late ask above), so the count is of recent asks, not of
    calls in flight."""

    def __init__(self, max_remembered: int = MAX_CALLS_REMEMBERED) -> None:
        self._max = max_remembered
        # call id -> its last mark (None: none yet; ``_ENDED``: withdrawn)
        self._seen: OrderedDict[str, Any] = OrderedDict()

    def first(self, pending: Any) -> bool:
        call_id = _call_id(pending)
        if call_id is None:
            return True
        if call_id in self._seen:
            self._seen.move_to_end(call_id)
            return False
        self._seen[call_id] = None
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return True

    def mark(self, pending: Any) -> Any:
        """The call's last choice's mark (None: none kept, or it ended); ``first`` must have
        seen it."""
        call_id = _call_id(pending)
        mark = None if call_id is None else self._seen.get(call_id)
        return None if mark is _ENDED else mark

    def remember(self, pending: Any, mark: Any) -> None:
        call_id = _call_id(pending)
        if call_id is not None and self._seen.get(call_id, _ENDED) is not _ENDED:
            self._seen[call_id] = mark

    def end(self, pending: Any) -> None:
        """The call was withdrawn (no replica took work for it): a later ask keeps no mark."""
        call_id = _call_id(pending)
        if call_id is not None and call_id in self._seen:
            self._seen[call_id] = _ENDED

    def ended(self, pending: Any) -> bool:
        call_id = _call_id(pending)
        return call_id is not None and self._seen.get(call_id) is _ENDED


_ENDED = object()  # ``FirstTries``: a withdrawn call's place for its mark


def has_call_id(pending: Any) -> bool:
    """Whether ``pending`` carries Ray's internal request id (``FirstTries`` knows it by that)."""
    return _call_id(pending) is not None


def _call_id(pending: Any) -> str | None:
    metadata = getattr(pending, "metadata", None)
    call_id = getattr(metadata, "internal_request_id", None)
    return call_id if isinstance(call_id, str) and call_id else None


def is_stale(report: ReplicaReport | None, now_s: float, stale_after_s: float) -> bool:
    """Whether a replica's latest report (stamped on the router's clock) is older than
    ``stale_after_s``. NOTE: Ray Serve keeps handing the router a frozen or unreachable replica's
    last routing stats, "up" included, so only their age tells. A replica that has not reported
    yet is not stale (it is starting; its first calls wait for it)."""
    return report is not None and now_s - report.at_s > stale_after_s


def in_rotation(
    replicas: Mapping[str, Any],
    reports: Mapping[str, ReplicaReport | None],
    now_s: float,
    stale_after_s: float,
) -> dict[str, Any]:
    """The replicas (id -> Ray's running replica) whose latest routing stats do not say their
    engine is down or hung and whose report (``reports``, stamped) is not stale; all of them
    when none would remain (each then refuses, or waits, rather than nothing being tried)."""
    up = {
        i: r
        for i, r in replicas.items()
        if (r.routing_stats or {}).get(UP_KEY, True)
        and not is_stale(reports.get(i), now_s, stale_after_s)
    }
    return up or dict(replicas)


def without(replicas: Mapping[str, Any], avoid: frozenset[str]) -> dict[str, Any]:
    return {i: r for i, r in replicas.items() if i not in avoid}


def session_of(request: EngineRequest) -> str | None:
    """The router's session key: the caller's session within its tenant (two tenants' users of
    the same name are different sessions)."""
    if request.session_key is None:
        return None
    return f"{request.tenant}/{request.session_key}"


def route_request_of(args: list[Any] | tuple[Any, ...]) -> RouteRequest:
    """What the policy needs of a handle call: a ``generate`` call's request, else (cache
    calls, status) an adapter-less request of no tokens."""
    request = args[0] if args else None
    if not isinstance(request, EngineRequest):
        return RouteRequest(None, None, 0)
    key = None if request.adapter_key is None else str(request.adapter_key)
    return RouteRequest(
        key, session_of(request), len(request.prompt_token_ids), tenant=request.tenant
    )


class PlacementNames:
    """The names the policy knows the offered replicas by: ``rank_name`` of the deployment rank
    a replica's stats carry (``RANK_KEY``), else its Ray id (no rank reported yet, or a rank two
    offered replicas claim, as a replica stopping and its replacement may for a moment). Ray
    draws a new id for every replica it starts, but hands a replacement the rank it replaces
    (docs/fleet.md, "Placement identity"), so placement, sessions and dedications by name
    outlive a replacement and are the same in every deployment. Each report is renamed once
    (the router reuses a view built on the very same report object)."""

    def __init__(self) -> None:
        # name -> (the report as stamped, the same renamed)
        self._renamed: dict[str, tuple[ReplicaReport, ReplicaReport]] = {}
        self.ids: dict[str, str] = {}  # name -> Ray id, as of the latest ``rename``

    def rename(
        self,
        stats: Mapping[str, Mapping[str, Any]],
        reports: Mapping[str, ReplicaReport | None],
    ) -> dict[str, ReplicaReport | None]:
        """``reports`` (by Ray id) keyed and named by placement name; ``stats``: each replica's
        routing stats, by Ray id."""
        ranks = {i: rank_of(stats.get(i) or {}) for i in reports}
        claims = Counter(r for r in ranks.values() if r is not None)
        names = {i: i if r is None or claims[r] > 1 else rank_name(r) for i, r in ranks.items()}
        self.ids = {name: i for i, name in names.items()}
        for gone in set(self._renamed) - self.ids.keys():
            del self._renamed[gone]
        return {names[i]: self._renamed_report(names[i], report) for i, report in reports.items()}

    def id_of(self, name: str) -> str:
        """The Ray id of the replica named ``name`` at the latest ``rename`` (``name`` itself if
        none is: a Ray id, or a replica gone since)."""
        return self.ids.get(name, name)

    def _renamed_report(self, name: str, report: ReplicaReport | None) -> ReplicaReport | None:
        if report is None or report.replica_id == name:
            return report
        known = self._renamed.get(name)
        if known is not None and known[0] is report:
            return known[1]
        renamed = replace(report, replica_id=name)
        self._renamed[name] = (report, renamed)
        return renamed


def rank_of(stats: Mapping[str, Any]) -> int | None:
    """The deployment rank ``stats`` carry (``RANK_KEY``), or None (none, or not a rank)."""
    rank = stats.get(RANK_KEY)
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank
    return None


class ReportStamps:
    """Each replica's current report, stamped on the router's clock with when it was made.

    The stamp is the replica's own ``at_s`` plus the smallest (router now - replica ``at_s``)
    seen from that replica: its clock's offset plus the quickest delivery. NOTE: not the time
    the router first saw it: the router sees stats only when it routes, so after a quiet spell
    a frozen replica's last report would look new, and it would stay in rotation for a whole
    ``stale_after_s`` more. Never later than now (a report is not from the future). A report is
    decoded and stamped once (``report_cache.DecodedReports``, by its number): the same report
    seen again keeps its stamp."""

    def __init__(self) -> None:
        self._decoded = DecodedReports()
        self._seen: dict[str, tuple[ReplicaReport, ReplicaReport]] = {}  # id -> (made, stamped)
        self._offset_s: dict[str, float] = {}  # id -> smallest (router now - replica at_s)

    def report_of(
        self, replica_id: str, stats: Mapping[str, Any], now_s: float
    ) -> ReplicaReport | None:
        payload = stats.get(REPORT_KEY)
        previous = self._seen.get(replica_id)
        kept = None if previous is None else previous[1]
        if payload is None:
            return kept
        try:
            report = self._decoded.decode(replica_id, stats.get(SEQ_KEY), payload)
        except MalformedReportError as exc:
            ROUTING_LOG.malformed_reports += 1
            _log.warning("replica %s sent a malformed report: %s", replica_id, exc)
            return kept
        if report is None:  # refused when first seen
            return kept
        if previous is not None and previous[0] is report:
            return kept  # the same report as before: its stamp
        offset_s = min(self._offset_s.get(replica_id, math.inf), now_s - report.at_s)
        self._offset_s[replica_id] = offset_s
        stamped = replace(report, at_s=min(now_s, report.at_s + offset_s))
        self._seen[replica_id] = (report, stamped)
        return stamped

    def forget_except(self, replica_ids: set[str]) -> None:
        self._decoded.forget_except(replica_ids)
        for gone in set(self._seen) - replica_ids:
            del self._seen[gone]
        for gone in set(self._offset_s) - replica_ids:
            del self._offset_s[gone]
