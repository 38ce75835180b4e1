"""Rolling request statistics per adapter and the warm policies derived from them.

Torch-free: the simulator reuses it. Rolling windows are exponentially decaying counters: a
counter with time constant ``tau`` holds ``sum(exp(-(now - t_i) / tau))`` over past requests,
so ``count / tau`` is the request rate over roughly the last ``tau`` seconds. Unlike bucketed
windows this costs four floats per adapter and never drops a whole bucket at once (no cliff in
the policies that read it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.residency.ledger import Tier, check_tier_share

# Time constants of the rolling windows: 1 min (eviction recency), 5 min, 1 h, 24 h (warm policy).
WINDOWS_S = (60.0, 300.0, 3600.0, 86400.0)


@dataclass(frozen=True)
class RequestRates:
    """Requests per second of one adapter over each rolling window."""

    per_1m: float  # rate over about the last minute
    per_5m: float  # rate over about the last five minutes
    per_1h: float  # rate over about the last hour
    per_24h: float  # rate over about the last day


ZERO_RATES = RequestRates(0.0, 0.0, 0.0, 0.0)


class RollingRates:
    """Decaying request counters over :data:`WINDOWS_S` (one instance per adapter).

    The last ``rates`` answer is kept until the next ``record``: one placement asks for the
    same copy's rates at the same clock reading several times (its victim order's key and
    group, the policy's candidate), and each answer costs four ``exp``."""

    __slots__ = ("_at_s", "_counts", "_last")

    def __init__(self) -> None:
        self._counts = [0.0] * len(WINDOWS_S)
        self._at_s: float | None = None
        self._last: tuple[float, RequestRates] | None = None  # (now_s, rates at now_s)

    def record(self, now_s: float, count: float = 1.0) -> None:
        """Adds ``count`` requests at ``now_s`` (times must not go back): decay and add in one
        pass (the same floats as decaying first: ``c * exp(..)`` is rounded before the add), no
        ``exp`` when no time passed (``exp(0)`` is 1: ``c * 1.0`` is ``c``)."""
        self._last = None
        at_s = self._at_s
        if at_s is not None and now_s > at_s:
            dt = now_s - at_s
            self._counts = [
                c * math.exp(-dt / tau) + count
                for c, tau in zip(self._counts, WINDOWS_S, strict=True)
            ]
            self._at_s = now_s
            return
        self._counts = [c + count for c in self._counts]
        if at_s is None:
            self._at_s = now_s

    def rates(self, now_s: float) -> RequestRates:
        if self._at_s is None:
            return ZERO_RATES
        last = self._last
        if last is not None and last[0] == now_s:
            return last[1]
        dt = max(0.0, now_s - self._at_s)
        values = [
            c * math.exp(-dt / tau) / tau for c, tau in zip(self._counts, WINDOWS_S, strict=True)
        ]
        rates = RequestRates(*values)
        self._last = (now_s, rates)
        return rates


@dataclass(frozen=True)
class AutoWarmConfig:
    """Automatic promotion / demotion thresholds (requests per second).

    Promotion to ``gpu`` needs the 5-minute rate at ``gpu_rps``; to ``cpu`` the larger of the
    1-hour and 24-hour rates at ``cpu_rps``. Demotion happens only once the rate falls below
    ``threshold * (1 - hysteresis)``, so an adapter hovering at a threshold does not flap.
    """

    gpu_rps: float = 0.5  # 5-minute rate that promotes to gpu
    cpu_rps: float = 0.01  # 1-hour / 24-hour rate that promotes to cpu
    hysteresis: float = 0.5  # fraction below a threshold before demotion

    def __post_init__(self) -> None:
        if not self.gpu_rps > 0:
            raise ValueError(f"gpu_rps {self.gpu_rps} is invalid; expected > 0")
        if not 0 < self.cpu_rps <= self.gpu_rps:
            raise ValueError(f"cpu_rps {self.cpu_rps} is invalid; expected in (0, gpu_rps]")
        if not 0 <= self.hysteresis < 1:
            raise ValueError(f"hysteresis {self.hysteresis} is invalid; expected in [0, 1)")


def auto_warm(rates: RequestRates, current: WarmPolicy, config: AutoWarmConfig) -> WarmPolicy:
    """The warm policy the request statistics call for, given the one currently applied."""
    keep = 1.0 - config.hysteresis
    gpu_bar = config.gpu_rps * (keep if current is WarmPolicy.GPU else 1.0)
    if rates.per_5m >= gpu_bar:
        return WarmPolicy.GPU
    cpu_bar = config.cpu_rps * (keep if current in (WarmPolicy.GPU, WarmPolicy.CPU) else 1.0)
    if max(rates.per_1h, rates.per_24h) >= cpu_bar:
        return WarmPolicy.CPU
    return WarmPolicy.ON_DEMAND


_WARM_TIERS = {
    WarmPolicy.GPU: frozenset({Tier.L0}),
    WarmPolicy.CPU: frozenset({Tier.L1}),
    WarmPolicy.ON_DEMAND: frozenset(),
}


@dataclass(frozen=True)
class WarmHold:
    """A warm policy that keeps a revision pinned in a tier (``PinBook.warm_hold``)."""

    policy: WarmPolicy  # gpu pins L0, cpu pins L1
    automatic: bool  # derived from the request rates (False: the operator's setting)


class PinBook:
    """Which tiers each revision is pinned in: explicit operator pins, plus its warm policy.

    The warm policy is the operator's when one was set (operator settings win), otherwise the
    automatic one derived from the rolling request rates. Bounded: a revision is held only
    while it has an operator pin or setting, or an automatic policy other than on-demand (which
    pins it, so its copies stay); unpinned and demoted revisions are forgotten. Revisions
    requested since the last rebalance are held until it (or until ``forget``).

    A rebalance judges only the revisions ``due``: those requested or released from an
    operator setting since the last one, and the automatically promoted ones. Any other
    revision was judged on-demand when last judged (or never requested) and its rates have only
    decayed since, so it would stay on-demand: an idle cache's rebalance costs O(promoted).

    ``tenant_share`` (the GPU tier's ``default_tenant_tier_share``) shares the ``max_auto_gpu``
    seats between tenants as ``residency/reclaim.py`` shares a tier's room: work-conserving, see
    ``seat_share`` and ``_gpu_seats``. A rebalance given the tenants' own GPU byte caps
    (``max_gpu_bytes``) seats no revision whose copy its tenant's cap would refuse.
    """

    def __init__(
        self, auto: AutoWarmConfig | None, max_auto_gpu: int, tenant_share: float = 1.0
    ) -> None:
        if max_auto_gpu < 0:
            raise ValueError(f"max_auto_gpu {max_auto_gpu} is invalid; expected >= 0")
        check_tier_share(tenant_share, "tenant_share")
        self._auto_config = auto
        self._max_auto_gpu = max_auto_gpu
        self._seat_share = seat_share(max_auto_gpu, tenant_share)
        self._pins: dict[AdapterKey, set[Tier]] = {}
        self._operator: dict[AdapterKey, WarmPolicy] = {}
        self._auto: dict[AdapterKey, WarmPolicy] = {}  # never ON_DEMAND (the default)
        self._pending: set[AdapterKey] = set()  # requested or released since the last rebalance

    def pin(self, key: AdapterKey, tier: Tier) -> None:
        self._pins.setdefault(key, set()).add(tier)

    def unpin(self, key: AdapterKey, tier: Tier) -> None:
        tiers = self._pins.get(key)
        if tiers is not None:
            tiers.discard(tier)
            if not tiers:
                del self._pins[key]

    def explicit_pins(self) -> set[tuple[AdapterKey, Tier]]:
        """Every (revision, tier) pinned by a ``pin`` (neither a warm policy nor automatic)."""
        return {(key, tier) for key, tiers in self._pins.items() for tier in tiers}

    def pinnable_keys(self) -> set[AdapterKey]:
        """Revisions with an operator pin or setting, or an automatic warm policy: every
        revision a copy of which may be pinned (``is_pinned``) is among them."""
        return self._pins.keys() | self._operator.keys() | self._auto.keys()

    def num_keys(self) -> int:
        """Revisions with an operator pin or setting, or an automatic warm policy."""
        return len(self.pinnable_keys())

    def set_operator(self, key: AdapterKey, warm: WarmPolicy | None) -> None:
        if warm is None:
            if self._operator.pop(key, None) is not None and self._auto_config is not None:
                self._pending.add(key)  # automatic again: judged afresh at the next rebalance
        else:
            self._operator[key] = warm
            # NOTE: the automatic policy was left behind the setting, where an automatic gpu
            # still counted as a held seat (and kept the revision due) until the setting went
            self._auto.pop(key, None)

    def drop_auto(self, key: AdapterKey) -> None:
        """``key``'s automatic policy goes (its request rates were reset: ``TierState.
        drop_auto_warm``); an operator's setting and pins stay."""
        self._auto.pop(key, None)
        self._pending.discard(key)

    def requested(self, key: AdapterKey) -> None:
        """A request for ``key``: its rates rose, so the next rebalance judges it."""
        if self._auto_config is not None:
            self._pending.add(key)

    def forget(self, key: AdapterKey) -> None:
        """``key``'s request history is gone: no rebalance can judge it until a request."""
        self._pending.discard(key)

    def due(self) -> list[AdapterKey]:
        """The revisions the next rebalance must judge (see the class docstring)."""
        if self._auto_config is None:
            return []
        return sorted(self._pending | self._auto.keys())

    def warm_policy(self, key: AdapterKey) -> WarmPolicy:
        return self._operator.get(key) or self._auto.get(key, WarmPolicy.ON_DEMAND)

    def has_pin(self, key: AdapterKey, tier: Tier) -> bool:
        """Whether a ``pin`` holds ``key`` in ``tier`` (its warm policy left aside)."""
        return tier in self._pins.get(key, ())

    def warm_hold(self, key: AdapterKey, tier: Tier) -> WarmHold | None:
        """The warm policy that pins ``key`` in ``tier``, if one does."""
        policy = self.warm_policy(key)
        if tier not in _WARM_TIERS[policy]:
            return None
        return WarmHold(policy, automatic=key not in self._operator)

    def pinned_tiers(self, key: AdapterKey) -> frozenset[Tier]:
        return frozenset(self._pins.get(key, set())) | _WARM_TIERS[self.warm_policy(key)]

    def is_pinned(self, key: AdapterKey, tier: Tier) -> bool:
        return tier in self.pinned_tiers(key)

    def rebalance(
        self,
        rates: Mapping[AdapterKey, RequestRates],
        gpu_caps: Mapping[str, int] | None = None,
        gpu_bytes: Callable[[AdapterKey], int | None] | None = None,
    ) -> dict[AdapterKey, WarmPolicy]:
        """Automatic promotion/demotion for revisions without an operator policy; the changes.
        ``rates`` must cover every revision ``due`` that has a request history; revisions
        not due may be left out (their policy would not change). ``gpu_caps``: each capped
        tenant's GPU byte cap (the L0 ledger's); ``gpu_bytes``: a revision's GPU copy size,
        None where not known yet (see ``_gpu_seats``)."""
        self._pending.clear()
        changes: dict[AdapterKey, WarmPolicy] = {}
        config = self._auto_config
        if config is None:
            return changes
        wanted = {
            key: auto_warm(rates[key], self._auto.get(key, WarmPolicy.ON_DEMAND), config)
            for key in sorted(rates)
            if key not in self._operator
        }
        fits = self._cap_room(gpu_caps or {}, gpu_bytes or (lambda key: None), wanted)
        seated = self._gpu_seats(wanted, rates, config, fits)
        for key, judged in wanted.items():
            unseated = judged is WarmPolicy.GPU and key not in seated
            policy = WarmPolicy.CPU if unseated else judged
            if policy is not self._auto.get(key, WarmPolicy.ON_DEMAND):
                if policy is WarmPolicy.ON_DEMAND:
                    del self._auto[key]
                else:
                    self._auto[key] = policy
                changes[key] = policy
        return changes

    def _gpu_seats(
        self,
        wanted: Mapping[AdapterKey, WarmPolicy],
        rates: Mapping[AdapterKey, RequestRates],
        config: AutoWarmConfig,
        fits: Callable[[AdapterKey], bool],
    ) -> set[AdapterKey]:
        """Which revisions that qualify for ``gpu`` get one of the ``max_auto_gpu`` seats: the
        hottest by 5-minute rate, an incumbent's rate counted at ``1 / (1 - hysteresis)`` so a
        challenger must beat it by that factor (no trading seats between similar rates).
        NOTE: ranked, not first come: in key order a tenant trickling just enough requests to
        qualify held every seat while a far hotter adapter of another tenant was refused one.

        With a tenant share (``seat_share``) the seats go in two rounds, as reclaim.py shares
        room: first each tenant's hottest revisions up to its share of the seats, then the seats
        left to the hottest of the rest (borrowed). So a tenant whose several adapters top the
        rates holds every seat only while no other tenant's revision qualifies (a lone tenant
        gets them all); once one does, the borrowed seats go to it whatever the rates.
        NOTE: by rates alone one tenant's traffic took every seat from the others' warm state.

        A candidate ``fits`` refuses (its tenant's GPU cap) gets no seat and counts nothing
        against its tenant's share: the seat goes to the next by rank.
        NOTE: a tenant capped below its seat share was handed seats its cap refused the loads
        of; they waited, the seat held, while another tenant's qualifying revision went without."""
        held = [k for k, w in self._auto.items() if w is WarmPolicy.GPU and k not in wanted]
        free = max(0, self._max_auto_gpu - len(held))
        keep = 1.0 - config.hysteresis

        def rank(key: AdapterKey) -> tuple[float, bool, AdapterKey]:
            incumbent = self._auto.get(key) is WarmPolicy.GPU
            score = rates[key].per_5m / keep if incumbent else rates[key].per_5m
            return (-score, not incumbent, key)

        candidates = sorted((k for k, w in wanted.items() if w is WarmPolicy.GPU), key=rank)
        share = self._seat_share
        if share is None:
            seats: set[AdapterKey] = set()
            for key in candidates:
                if len(seats) == free:
                    break
                if fits(key):
                    seats.add(key)
            return seats
        taken: dict[str, int] = {}  # seats per tenant: unjudged holders, then this round's
        for key in held:
            taken[key.tenant] = taken.get(key.tenant, 0) + 1
        seated: list[AdapterKey] = []
        beyond: list[AdapterKey] = []  # candidates past their tenant's share, by rank
        for key in candidates:
            if len(seated) == free:
                break
            if taken.get(key.tenant, 0) >= share:
                beyond.append(key)
            elif fits(key):
                taken[key.tenant] = taken.get(key.tenant, 0) + 1
                seated.append(key)
        borrowed = [k for k in beyond if fits(k)]  # after the shares' seats took their bytes
        return set(seated + borrowed[: free - len(seated)])

    def _cap_room(
        self,
        caps: Mapping[str, int],
        gpu_bytes: Callable[[AdapterKey], int | None],
        judged: Mapping[AdapterKey, WarmPolicy],
    ) -> Callable[[AdapterKey], bool]:
        """The ``fits`` of ``_gpu_seats``: whether a revision's GPU copy fits under its
        tenant's cap beside that tenant's GPU pins, operator gpu settings, the automatic seats
        not ``judged`` now (they keep theirs) and the seats granted so far (a yes takes the
        copy's bytes). A revision whose size is not known yet fits while its tenant has room
        left, counted as 0 bytes. No cap: always fits. O(pins and automatic policies) per
        rebalance, only where some tenant has a cap."""
        if not caps:
            return lambda key: True
        room = dict(caps)
        counted: set[AdapterKey] = set()  # revisions whose bytes are taken already
        holders = [
            *(k for k, tiers in self._pins.items() if Tier.L0 in tiers),
            *(k for k, w in self._operator.items() if w is WarmPolicy.GPU),
            *(k for k, w in self._auto.items() if w is WarmPolicy.GPU and k not in judged),
        ]
        for key in holders:
            if key.tenant in room and key not in counted:
                counted.add(key)
                room[key.tenant] -= gpu_bytes(key) or 0

        def fits(key: AdapterKey) -> bool:
            left = room.get(key.tenant)
            if left is None or key in counted:
                return True
            size = gpu_bytes(key)
            if (left <= 0) if size is None else (size > left):
                return False
            counted.add(key)
            room[key.tenant] = left - (size or 0)
            return True

        return fits


DEFAULT_AUTO_WARM_INTERVAL_S = 5.0  # seconds between two automatic rebalances (serve and sim)


def check_auto_warm_settings(
    auto_warm: bool, interval_s: float, max_auto_gpu_slots: int | None
) -> None:
    """ValueError naming ``max_auto_gpu_slots`` or ``auto_warm_interval_s`` when one is set
    while ``auto_warm`` is off: only automatic promotion reads them (they were taken in
    silence). ``loraplex serve`` and the simulator check their settings so."""
    if auto_warm:
        return
    for name, value, default in (
        ("max_auto_gpu_slots", max_auto_gpu_slots, None),
        ("auto_warm_interval_s", interval_s, DEFAULT_AUTO_WARM_INTERVAL_S),
    ):
        if value != default:
            raise ValueError(
                f"{name} {value} is set while auto_warm is off; expected auto_warm on, or "
                f"{name} left out (only automatic warm promotion reads it)"
            )


def default_auto_gpu_slots(gpu_slots: int) -> int:
    """``max_auto_gpu_slots`` when unset: a quarter of the GPU slots, rounded down (``loraplex
    serve`` and the simulator resolve it so), always fewer than the slots."""
    return gpu_slots // 4


def seat_share(max_auto_gpu: int, tenant_share: float) -> int | None:
    """The automatic GPU seats each tenant keeps against the others: its ``tenant_share`` of
    the ``max_auto_gpu`` seats rounded down, or one seat if more (as a tier's share never
    refuses one copy); None: no share (``tenant_share`` 1.0)."""
    if tenant_share >= 1:
        return None
    return max(1, int(max_auto_gpu * tenant_share))
