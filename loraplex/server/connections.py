"""Which client connections the listener keeps: a gate every accepted connection passes.

Half-open sockets that never send a request cost the server nothing but a file descriptor and a
slot, yet ~1,100 of them, reopened as the server closed them, failed 95 % of every tenant's
requests: uvicorn's one connection cap answered every request 503, authenticated or not. The
gate keeps four bounds instead, and none of them ever refuses a request on a connection already
open:

- ``accepts_per_s_per_address``: new connections per second from one client address (a token
  bucket holding one second's worth); beyond it a connection is closed as soon as it is accepted;
- ``max_connections_per_address``: open connections from one client address;
- ``max_unauthenticated_connections``: open connections on which no request has passed a
  credential check yet (``authenticated``), a budget smaller than the whole;
- ``max_connections``: open connections in all.

A client "address" is what ``address_key`` makes of the peer's IP: an IPv4 address as it is
(also when a dual-stack listener reports it IPv4-mapped, ``::ffff:a.b.c.d``), an IPv6 address
its ``/ipv6_address_prefix`` network (``/64`` by default: one subscriber's or one host's
allocation, as rate limiters usually count IPv6). Counted per IPv6 address, one client holding
a /64 would pass both per-address bounds with a fresh address per connection.

A connection that would pass one of the last three bounds takes the place of the oldest *idle*
unauthenticated connection (no request in flight) that counts against it, which is closed; only
when there is none is the newcomer closed. So a flood of idle sockets can only push out its own
kind: a new client's connection gets in, sends its request at once and, authenticated, is out of
the flood's reach; connections of authenticated tenants are never closed for it.

At ``max_connections`` with no idle unauthenticated connection to replace, the newcomer takes the
place of the *quietest* connection of the tenant holding the most open connections: idle, nothing
of a next request received (parsed, buffered, or unread in its socket), and the longest since
anything was received or answered on it. A client may send its next request on a kept-alive
connection at the very instant the server closes it, and a POST lost that way cannot be retried
blindly: a request whose first bytes reached the server is never cut, and the quietest connection
is the least likely to have one on the wire. (A grace instead, closing only connections quiet for
a while, let a tenant that touched all its connections within it keep every newcomer out.) When
that tenant has no such connection, the one of its connections whose request body has been due
longest, at least ``RECEIVING_GRACE_S`` after its head, is cut (that request was not handled: its
body never came); failing that, its oldest one not yet draining is told to close after its
answer (``drain``: the request in flight, or the next one, is answered with ``Connection:
close``), and the newcomer waits for the room one drained connection frees (``hold``: nothing of
it read, its head deadline running; ``let_in`` when a connection closes, the oldest waiting one
first, before any later connection), at most one newcomer for each drained connection and
``MAX_WAITING`` in all; past that (places held by newcomers whose clients left, ``gone``, freed
first) it is closed, and its retry finds the room. NOTE: closed at
once, every newcomer was reset until the first drained answer ended: the first 1-4 of them,
0.5 s apart, in every run of attack round 19. NOTE: a drain freed nothing
while a request's body was due, so a tenant that held ``max_connections`` connections, each
with a head sent and its body never finished, shut every other tenant out until
``body_read_timeout_s`` answered them, and took the room back at once (attack round 18:
1 of 90 new connections of another tenant served in 45 s). NOTE:
without this, one tenant's key made every connection it opened unevictable: a tenant that kept
``max_connections`` connections open (from two addresses at the defaults), each kept alive by a
cheap request every few seconds, had every other tenant's new connections closed at accept.
Connections authenticated with the admin key are never closed for a newcomer.

While the gate has turned a newcomer away at ``max_connections`` or at
``max_unauthenticated_connections`` in the last ``CONTENDED_S``, a
tenant holding ``max_tenant_connection_share`` of ``max_connections`` or more is refused any
new connection: its first authenticated request is answered 429 (``code``
``max_tenant_connection_share``), and so is each next one on it while the tenant's other
connections still hold the share under contention; the connection is kept open, and the first
newcomer that finds no room cuts it with a reset. NOTE: closed after its 429, its room went to
whoever connected next, mostly the tenant's own reconnect (attack round 19). A newcomer that
still finds no room then cuts the oldest unauthenticated connection from another address where a
connection was refused at the share in the last ``CONTENDED_S``: taken for that tenant's
reconnect, which holds room with its request not yet read or checked (a tenant closing each
refused connection itself and reconnecting at once). A tenant behind that address with it (a
NAT, a proxy) loses such a new connection too, as with the per-address bounds; and each
newcomer turned away drains
the largest tenant's oldest connections down to that share (each closes after the answer in
flight: no admitted request is lost). NOTE: a drain alone freed room that the tenant's reconnect
took first, so a tenant with a whole request in flight on every connection (long streams, mostly
queued) kept every other tenant's new connections out: 1 of 40 served (attack round 18,
``body-hog --mode flight``; with the share 21-39 of 40: its reconnects, each refused, still took
room while their requests waited unread; docs/benchmarks/attack19.md). The share holds only
while newcomers are turned away:
with room left, one tenant may hold every connection.

A connection past its address's accept rate is not reset at once but held silently
(``tarpit.py``) and reset later, so its client does not reconnect at once: a flood's reconnects
are then bounded by the accept rate (before, ~2,300 handshakes a second from 1,100 sockets on
``bench serve``'s ``half-open-flood``, whose cost on 2 shared cores slowed everyone).
"""

from __future__ import annotations

import ipaddress
from collections import Counter, OrderedDict
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from loraplex.clock import Clock

# Seconds a request's body may be due after its head before, at ``max_connections``, its connection
# (of the tenant holding the most) is cut for a newcomer: one still arriving is left alone.
RECEIVING_GRACE_S = 1.0

# Seconds after the gate last turned a newcomer away (at ``max_connections`` or
# ``max_unauthenticated_connections``) during which a tenant at or above
# ``max_tenant_connection_share`` is refused new connections (module docstring).
CONTENDED_S = 30.0

# Newcomers that may wait at once for the room drained connections free (``admit_accepted``), at
# most one for each drained connection; each is a file descriptor (``fd_limit.py``).
MAX_WAITING = 64

# The scope state key under which the listener leaves the call that marks the request's
# connection authenticated (absent outside ``loraplex serve``'s listener, e.g. in TestClient).
MARK_AUTHENTICATED = "loraplex_mark_connection_authenticated"


def mark_authenticated(state: MutableMapping[str, Any], tenant: str | None = None) -> bool:
    """Called once a request passed its credential check: its connection leaves the
    unauthenticated budget and counts for ``tenant`` (None: the admin key) (``state``: the
    request's scope state). False: the connection is refused, ``tenant`` holding its share
    (``max_tenant_connection_share``): answer the request 429 and close it."""
    mark: Callable[[str | None], bool] | None = state.get(MARK_AUTHENTICATED)
    return mark is None or mark(tenant)


def address_key(address: str, ipv6_prefix: int) -> str:
    """The address the per-address bounds count ``address`` (a peer's host) under: an IPv4
    address as it is, an IPv4-mapped IPv6 address as its IPv4 address, another IPv6 address as
    its ``/ipv6_prefix`` network (``2001:db8::/64``); anything else (no IP: a Unix socket's
    empty host) as it is."""
    if ":" not in address:
        return address  # IPv4 (or no address): the accept path's common case, not parsed
    try:
        ip = ipaddress.IPv6Address(address)
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip), ipv6_prefix), strict=False))


@dataclass(frozen=True)
class GateLimits:
    """The gate's bounds (module docstring); each >= 1."""

    max_connections: int = 1024  # open connections in all
    max_unauthenticated_connections: int = 512  # open connections not yet authenticated
    max_connections_per_address: int = 512  # open connections from one client address
    accepts_per_s_per_address: int = 512  # new connections per second from one address
    # the fraction of max_connections one tenant may hold while newcomers are turned away
    max_tenant_connection_share: float = 0.5
    # IPv6 clients are counted per network of this prefix length (``address_key``)
    ipv6_address_prefix: int = 64

    def __post_init__(self) -> None:
        prefix = self.ipv6_address_prefix
        if isinstance(prefix, bool) or not isinstance(prefix, int) or not 1 <= prefix <= 128:
            raise ValueError(
                f"ipv6_address_prefix {prefix!r} is invalid; expected an int from 1 to 128"
            )
        for name in (
            "max_connections",
            "max_unauthenticated_connections",
            "max_connections_per_address",
            "accepts_per_s_per_address",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is invalid; expected an int >= 1")
        if self.max_unauthenticated_connections > self.max_connections:
            raise ValueError(
                f"max_unauthenticated_connections {self.max_unauthenticated_connections} is "
                f"invalid; expected <= max_connections {self.max_connections} (it is a share)"
            )
        share = self.max_tenant_connection_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ValueError(
                f"max_tenant_connection_share {share!r} is invalid; expected above 0, at most 1"
            )

    @property
    def tenant_share(self) -> int:
        """Connections one tenant may hold under contention: ``max_tenant_connection_share`` of
        ``max_connections``, at least 1."""
        return max(1, int(self.max_tenant_connection_share * self.max_connections))


class Member(Protocol):
    """What the gate needs of a connection."""

    def is_idle(self) -> bool:
        """No request in flight: closing it loses nobody's answer."""
        ...

    def quiet_s(self) -> float | None:
        """Seconds since anything was received or answered on it, when it is idle and nothing of
        a next request was parsed or buffered; None otherwise."""
        ...

    def evict(self) -> bool:
        """Close it, unless bytes of a request wait unread in its socket (then False)."""
        ...

    def drain(self) -> None:
        """Close it after its next answer (``Connection: close``), the one in flight if any."""
        ...

    def receiving_s(self) -> float | None:
        """Seconds since the head of its request whose body is still due (nothing of the
        answer sent); None otherwise."""
        ...

    def hold(self) -> bool:
        """Admitted to wait for room (``ConnectionGate.admit_accepted``): read nothing of it until
        ``let_in``; its head deadline still runs (then it closes, as any slow head does). False:
        it cannot wait, and is refused."""
        ...

    def let_in(self) -> None:
        """The room it waited for is its: read its request."""
        ...

    def gone(self) -> bool:
        """While it waits (``hold``): its client closed it (a reset, or an end of stream with
        nothing of a request before it), so nothing of it can be answered."""
        ...

    def cut_body(self) -> None:
        """Close it with a reset, its request's body still due (``receiving_s``), its requests
        refused (its tenant at ``max_tenant_connection_share``), taken for that tenant's
        reconnect (unauthenticated, from the address of such a refusal), or waiting for room
        (``hold``) while its address reached ``max_connections_per_address`` or its client
        left (``gone``)."""
        ...


class _Bucket:
    """Accept tokens of one address: ``rate`` a second, at most ``rate`` held."""

    def __init__(self, rate: int, now_s: float) -> None:
        self.tokens = float(rate)
        self.stamp_s = now_s

    def refill(self, rate: int, now_s: float) -> None:
        self.tokens = min(float(rate), self.tokens + (now_s - self.stamp_s) * rate)
        self.stamp_s = now_s


class ConnectionGate:
    """The open connections and their budgets (module docstring); event-loop thread only."""

    def __init__(self, limits: GateLimits, clock: Clock) -> None:
        self.limits = limits
        self._clock = clock
        self._open: dict[Member, str] = {}  # every admitted connection -> its address
        self._per_address: Counter[str] = Counter()
        self._unauthenticated: OrderedDict[Member, None] = OrderedDict()  # oldest first
        self._tenant_of: dict[Member, str] = {}  # connections a tenant key authenticated
        self._by_tenant: dict[str, OrderedDict[Member, None]] = {}  # oldest first
        self._buckets: dict[str, _Bucket] = {}
        self._draining: set[Member] = set()  # told to close after their next answer
        self._refused: set[Member] = set()  # refused at their tenant's share, kept open
        # client address -> when a connection from it was last refused at its tenant's share
        self._refused_at: dict[str, float] = {}
        self._turned_away_s: float | None = None  # when a newcomer last found no room
        # newcomers waiting for the room a drained connection frees, oldest first -> address
        self._waiting: OrderedDict[Member, str] = OrderedDict()
        self._making_room = False  # inside ``admit_accepted``: a freed place is the newcomer's
        self.num_refused = 0  # connections closed at accept, or refused at the tenant's share
        self.num_evicted = 0  # idle connections closed for a newcomer
        self.num_drained = 0  # tenant connections told to close after their answer

    @property
    def num_open(self) -> int:
        return len(self._open)

    @property
    def num_unauthenticated(self) -> int:
        return len(self._unauthenticated)

    def admit(self, member: Member, address: str) -> bool:
        """Whether ``member``, just accepted from ``address``, may stay; False: close it."""
        return self.accept(address) and self.admit_accepted(member, address)

    def accept(self, address: str) -> bool:
        """Takes ``address``'s accept token; False (counted refused): close the connection.
        The listening socket asks this before the connection costs anything
        (``gated_accept.py``); ``admit_accepted`` then checks the caps."""
        address = address_key(address, self.limits.ipv6_address_prefix)
        if self._take_accept_token(address):
            return True
        self.num_refused += 1
        return False

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def admit_accepted(self, member: Member, address: str) -> bool:
        """``admit`` for a connection whose accept token was taken (``accept``). At
        ``max_connections`` with connections drained (each closes after its answer), a newcomer
        waits for the room one of them frees (``hold``, then ``let_in``): at most one waits for
        each drained connection, in their order of arrival; True then too."""
        address = address_key(address, self.limits.ipv6_address_prefix)
        self._making_room = True  # a connection closed for this newcomer: its room
        try:
            room = self._make_room(address)
        finally:
            self._making_room = False
        if not room:
            if self._may_wait(address) and member.hold():
                self._waiting[member] = address
                return True
            self.num_refused += 1
            return False
        self._enter(member, address)
        return True

    def _may_wait(self, address: str) -> bool:
        """At ``max_connections`` only (the address's cap and the unauthenticated budget free
        no room by draining), while more connections are drained than newcomers wait."""
        limits = self.limits
        if self._per_address[address] >= limits.max_connections_per_address:
            return False
        if len(self._unauthenticated) >= limits.max_unauthenticated_connections:
            return False
        return self._take_waiting_place()

    def _take_waiting_place(self) -> bool:
        """A free waiting place, once those whose newcomer's client left (``gone``: forgotten,
        its socket closed) are freed. NOTE: a waiting newcomer is read only at its turn, so one
        whose client shut it held its place until its head deadline (10 s), another tenant's
        newcomer refused meanwhile (``tests/server/test_waiting_places.py``)."""
        places = min(MAX_WAITING, len(self._draining) - len(self._refused))
        if len(self._waiting) < places:
            return True
        for member in [m for m in self._waiting if m.gone()]:
            del self._waiting[member]
            member.cut_body()
        return len(self._waiting) < places

    def _enter(self, member: Member, address: str) -> None:
        self._open[member] = address
        self._per_address[address] += 1
        self._unauthenticated[member] = None

    def _let_waiting_in(self) -> None:
        """Room freed: the oldest waiting newcomers take it, before any later connection. One
        whose address reached ``max_connections_per_address`` while it waited (its cap was
        checked when it began to wait: others from it waited too, or came in) is closed, counted
        refused, as at accept."""
        limits = self.limits
        while not self._making_room and self._waiting and len(self._open) < limits.max_connections:
            if len(self._unauthenticated) >= limits.max_unauthenticated_connections:
                return
            member, address = self._waiting.popitem(last=False)
            if self._per_address[address] >= limits.max_connections_per_address:
                member.cut_body()
                self.num_refused += 1
                continue
            self._enter(member, address)
            member.let_in()

    def authenticated(self, member: Member, tenant: str | None = None) -> bool:
        """A request on ``member`` passed a credential check (idempotent): ``tenant``'s key, or
        the admin key (None). A connection is counted for the first tenant that used it. False
        (counted refused): ``tenant`` already held its share under contention (module
        docstring); the caller answers it 429 and keeps the connection open (a newcomer that
        needs the room cuts it; its next request is checked again, ``_still_refused``)."""
        self._unauthenticated.pop(member, None)
        if member in self._refused:  # kept open after its 429: refused again, or let in
            return self._still_refused(member)
        if tenant is None or member not in self._open or member in self._tenant_of:
            return True
        held = self._by_tenant.setdefault(tenant, OrderedDict())
        refused = len(held) >= self.limits.tenant_share and self._contended()
        self._tenant_of[member] = tenant
        held[member] = None
        if refused:  # never drained, counted held; cut first when a newcomer needs room
            self._draining.add(member)
            self._refused.add(member)
            self._forget_stale_refusals()
            self._refused_at[self._open[member]] = self._clock.now()
            self.num_refused += 1
        return not refused

    def _still_refused(self, member: Member) -> bool:
        """The next request on a connection refused at its tenant's share (kept open, its
        answer ``Connection: close``-free): False while its tenant's other connections still hold
        the share under contention; otherwise it counts as any other of the tenant's."""
        held = self._by_tenant[self._tenant_of[member]]
        others = sum(1 for other in held if other not in self._refused)
        if others >= self.limits.tenant_share and self._contended():
            return False
        self._refused.discard(member)
        self._draining.discard(member)
        return True

    def _contended(self) -> bool:
        turned_away_s = self._turned_away_s
        return turned_away_s is not None and self._clock.now() - turned_away_s < CONTENDED_S

    def release(self, member: Member) -> None:
        """``member`` closed (idempotent; an evicted member is already released)."""
        self._waiting.pop(member, None)
        address = self._open.pop(member, None)
        if address is None:
            return
        self._unauthenticated.pop(member, None)
        self._draining.discard(member)
        self._refused.discard(member)
        self._per_address[address] -= 1
        if not self._per_address[address]:
            del self._per_address[address]
        tenant = self._tenant_of.pop(member, None)
        if tenant is not None:
            held = self._by_tenant[tenant]
            del held[member]
            if not held:
                del self._by_tenant[tenant]
        self._let_waiting_in()

    def _make_room(self, address: str) -> bool:
        limits = self.limits
        at_address_cap = self._per_address[address] >= limits.max_connections_per_address
        if at_address_cap and not self._evict_oldest_idle(address):
            return False
        if len(self._unauthenticated) >= limits.max_unauthenticated_connections:
            room = self._evict_oldest_idle(None) or self._cut_reconnect(address)
        elif len(self._open) >= limits.max_connections:
            room = self._evict_oldest_idle(None) or self._cut_refused()
            room = room or self._cut_reconnect(address) or self._evict_largest_tenants_idle()
        else:
            return True
        if not room:  # a tenant's reconnects filling either budget turn newcomers away
            self._turned_away_s = self._clock.now()
        return room

    def _evict_largest_tenants_idle(self) -> bool:
        """Closes the quietest connection of the tenant holding the most open connections, else
        its slowest body past ``RECEIVING_GRACE_S``; without either, drains its oldest connections
        not yet draining (past ``tenant_share``: as many as leave it that many not draining, none
        when its draining ones already do; within it: one) and returns False (only at
        ``max_connections``: an address's cap still closes none of them, as the NOTE of
        docs/operations.md on shared addresses says)."""
        largest = max(self._by_tenant.values(), key=len, default=OrderedDict())
        quiet = [(q, i, m) for i, m in enumerate(largest) if (q := m.quiet_s()) is not None]
        for _, _, member in sorted(quiet, key=lambda x: (-x[0], x[1])):
            if member.evict():
                self.release(member)
                self.num_evicted += 1
                return True
        due = [(r, m) for m in largest if (r := m.receiving_s()) is not None]
        slowest = max(due, key=lambda x: x[0], default=None)
        if slowest is not None and slowest[0] >= RECEIVING_GRACE_S:
            slowest[1].cut_body()
            self.release(slowest[1])
            self.num_evicted += 1
            return True
        share = self.limits.tenant_share
        staying = [member for member in largest if member not in self._draining]
        # past its share: down to it (those draining free room); within it: one, as before
        count = len(staying) - share if len(largest) > share else 1
        for member in staying[: max(0, count)]:
            self._draining.add(member)
            self.num_drained += 1
            member.drain()
        return False

    def _cut_refused(self) -> bool:
        """Cuts a connection refused at its tenant's share (its 429 not yet taken: a reset
        instead), so that the tenant's reconnects, each refused, hold no room a newcomer needs."""
        for member in self._refused:
            member.cut_body()
            self.release(member)
            self.num_evicted += 1
            return True
        return False

    def _cut_reconnect(self, address: str) -> bool:
        """Cuts the oldest unauthenticated connection from another address than ``address``'s
        where a connection was refused at its tenant's share in the last ``CONTENDED_S``: taken
        for that tenant's reconnect, its request not yet read or checked (module docstring)."""
        self._forget_stale_refusals()
        for member in self._unauthenticated:
            source = self._open[member]
            if source != address and source in self._refused_at:
                member.cut_body()
                self.release(member)
                self.num_evicted += 1
                return True
        return False

    def _forget_stale_refusals(self) -> None:
        """Drops the addresses refused longer than ``CONTENDED_S`` ago (on each refusal too, so
        the map holds only the last ``CONTENDED_S``'s addresses however rarely room is short)."""
        now_s = self._clock.now()
        for stale in [a for a, at_s in self._refused_at.items() if now_s - at_s >= CONTENDED_S]:
            del self._refused_at[stale]

    def _evict_oldest_idle(self, address: str | None) -> bool:
        """Closes the oldest idle unauthenticated connection (from ``address`` when given)."""
        for member in self._unauthenticated:
            at_address = address is None or self._open[member] == address
            if at_address and member.is_idle() and member.evict():
                self.release(member)
                self.num_evicted += 1
                return True
        return False

    def _take_accept_token(self, address: str) -> bool:
        rate, now_s = self.limits.accepts_per_s_per_address, self._clock.now()
        bucket = self._buckets.get(address)
        if bucket is None:
            self._prune_buckets(now_s)
            bucket = self._buckets[address] = _Bucket(rate, now_s)
        bucket.refill(rate, now_s)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _prune_buckets(self, now_s: float) -> None:
        """Forgets full buckets once there are many: a full bucket acts as a new one, so this
        changes no decision and keeps the map at about the addresses active in the last second."""
        if len(self._buckets) < 2 * self.limits.max_connections:
            return
        rate = self.limits.accepts_per_s_per_address
        for address, bucket in list(self._buckets.items()):
            bucket.refill(rate, now_s)
            if bucket.tokens >= rate:
                del self._buckets[address]
