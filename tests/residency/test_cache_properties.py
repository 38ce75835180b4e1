"""Random operation sequences against the cache; every invariant is checked after every step."""

from __future__ import annotations

from concurrent.futures import Future

from cache_kit import Rig, key, make_rig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraplex.errors import CapacityError, CorruptArtifactError, LoadCancelledError
from loraplex.residency.cache import Lease
from loraplex.residency.ledger import Tier
from loraplex.residency.stats import Stage

KEYS = [key(t, n) for t in ("p", "q") for n in ("a", "b", "c", "d")]
TIERS = [Tier.L0, Tier.L1, Tier.L2]
STAGES = [Stage.RESOLVE, Stage.FETCH, Stage.VERIFY, Stage.READ, Stage.COPY]

ops = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(KEYS)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("pin"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("unpin"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("prefetch"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("evict"), st.sampled_from(KEYS), st.sampled_from(TIERS)),
    st.tuples(st.just("fail"), st.sampled_from(KEYS), st.sampled_from(STAGES)),
    st.tuples(st.just("cancel"), st.sampled_from(KEYS)),
    st.tuples(st.just("wait"), st.sampled_from([0.0, 0.004, 0.012, 0.5, 3.0])),
)


def _protected(rig: Rig) -> set[tuple[Tier, object]]:
    """Copies that must survive the next step: pinned or in use (and ready)."""
    return {
        (tier, k)
        for tier, ledger in rig.cache.ledgers.items()
        for k, e in ledger.entries.items()
        if e.ready and (e.pinned or (tier is Tier.L0 and e.refcount > 0))
    }


def _unprotected_by(op: tuple, leases: list[Lease]) -> set[tuple[Tier, object]]:  # type: ignore[type-arg]
    """The copy whose protection ``op`` may lift: an unpinned one, or a released lease's L0
    copy (another lease or a pin may still hold it; then it merely may go, not must)."""
    name, *args = op
    if name == "unpin":
        return {(args[1], args[0])}
    if name == "release" and leases:
        return {(Tier.L0, leases[args[0] % len(leases)].key)}
    return set()


def _apply(rig: Rig, op: tuple, leases: list[Lease], pending: list[Future]) -> None:  # type: ignore[type-arg]
    name, *args = op
    cache = rig.cache
    if name == "acquire":
        pending.append(cache.acquire_future(args[0], deadline_s=2.0))
    elif name == "release" and leases:
        leases.pop(args[0] % len(leases)).release()
    elif name == "pin":
        pending.append(cache.pin(args[0], args[1]))
    elif name == "unpin":
        cache.unpin(args[0], args[1])
    elif name == "prefetch":
        pending.append(cache.prefetch(args[0], args[1]))
    elif name == "evict":
        cache.evict(args[0], args[1])
    elif name == "fail":
        rig.pipeline.fail_at[(args[0], args[1])] = CorruptArtifactError("injected")
    elif name == "cancel":
        cache.cancel(args[0])
    elif name == "wait":
        rig.executor.run_until(rig.clock.now() + args[0])


def _collect(pending: list[Future], leases: list[Lease]) -> None:  # type: ignore[type-arg]
    for future in [f for f in pending if f.done()]:
        pending.remove(future)
        if future.cancelled():
            continue
        error = future.exception()
        if error is None:
            if isinstance(future.result(), Lease):
                leases.append(future.result())
        else:
            assert isinstance(error, CapacityError | CorruptArtifactError | LoadCancelledError), (
                error
            )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(ops, max_size=40), st.sampled_from(["lru", "lru_priority", "cost_aware", "admit_gdsf"])
)
def test_random_operations_keep_every_invariant(sequence: list[tuple], policy: str) -> None:  # type: ignore[type-arg]
    rig = make_rig(
        policy,
        slots=3,
        l1=4,
        l2=6,
        tenant_l0={"q": 200},
        max_concurrent_loads=2,
        tenant_max_concurrent_loads=1,
        default_deadline_s=2.0,
    )
    leases: list[Lease] = []
    pending: list[Future] = []  # type: ignore[type-arg]
    for op in sequence:
        protected = _protected(rig) - _unprotected_by(op, leases)
        _apply(rig, op, leases, pending)
        _collect(pending, leases)
        rig.check()
        for tier, k in protected:
            assert rig.cache.is_resident(k, tier), (op, tier, k)  # type: ignore[arg-type]
        for lease in leases:
            entry = rig.cache.ledgers[Tier.L0].get(lease.key)
            assert entry is not None and entry.ready and entry.slot == lease.slot
            assert rig.pipeline.slots[lease.slot] == lease.key
    rig.pipeline.fail_at.clear()
    rig.executor.run_until(rig.clock.now() + 10.0)
    _collect(pending, leases)
    for lease in leases:
        lease.release()
    rig.executor.run_until(rig.clock.now() + 10.0)
    rig.check()
    summary = rig.cache.summary()
    assert summary.num_loading == summary.num_blocked
    assert all(
        e.refcount == 0 for lg in rig.cache.ledgers.values() for e in lg.entries.values() if e.ready
    )
