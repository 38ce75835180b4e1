"""``SpanShare``: a tenant's forced traces draw on its own span bucket."""

from __future__ import annotations

from loraplex.tracing import share
from loraplex.tracing.share import SpanShare


def test_a_tenants_bucket_empties_refills_and_is_its_own() -> None:
    now = [0.0]
    parents = SpanShare(burst_spans=10, spans_per_s=2.0, clock_s=lambda: now[0])
    assert parents.has_room("acme")
    parents.charge("acme", 8)
    assert parents.has_room("acme")  # 2 left: the next trace is let in whatever its size
    parents.charge("acme", 8)  # 6 in debt
    assert not parents.has_room("acme") and parents.has_room("globex")
    now[0] += 3.0  # 6 spans back: still none
    assert not parents.has_room("acme")
    now[0] += 0.5
    assert parents.has_room("acme")
    now[0] += 1000.0  # refills to the burst, never past it
    parents.charge("acme", 10)
    assert not parents.has_room("acme")


def test_full_buckets_are_forgotten_once_there_are_many() -> None:
    now = [0.0]
    parents = SpanShare(burst_spans=4, spans_per_s=1.0, clock_s=lambda: now[0])
    for i in range(share.MAX_TENANTS):
        parents.charge(f"t{i}", 1 if i else 100)
    now[0] += 2.0  # every bucket but t0's is full again
    assert parents.has_room("newcomer")
    assert len(parents._buckets) == 2  # t0 (in debt) and the newcomer
    assert not parents.has_room("t0")


def test_the_table_stays_at_its_cap_when_no_bucket_is_full() -> None:
    now = [0.0]
    parents = SpanShare(burst_spans=4, spans_per_s=1.0, clock_s=lambda: now[0])
    for i in range(share.MAX_TENANTS):
        parents.charge(f"t{i}", 5 + i % 7)  # every bucket in debt: none can be forgotten as full
    parents.charge("t3", -5)  # t3 (1 span left; the others 1 to 7 in debt) is nearest to full
    for i in range(50):
        assert parents.has_room(f"newcomer{i}")
        assert len(parents._buckets) <= share.MAX_TENANTS
    assert not parents.has_room("t4")  # a deep debtor was kept: forgetting it would pardon it
    assert "t3" not in parents._buckets
