"""The WORKLOADS.md generator: determinism, shapes of each scenario, trace round trip."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from loraplex.bench import workloads as w

SMALL = w.ScenarioParams(duration_s=200.0, rate=20.0, num_adapters=64)


@pytest.mark.parametrize("name", sorted(w.SCENARIOS))
def test_scenarios_are_deterministic_sorted_and_reference_their_adapters(name: str) -> None:
    first, second = w.generate(name, 7, SMALL), w.generate(name, 7, SMALL)
    assert first == second
    assert first != w.generate(name, 8, SMALL)
    times = [r.t_s for r in first.requests]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < SMALL.duration_s
    known = {(a.tenant, a.name) for a in first.adapters}
    assert all((r.tenant, r.adapter) in known for r in first.requests)


def test_hot_burst_shape() -> None:
    wl = w.generate("hot-burst", 0, SMALL)
    hot = [r for r in wl.requests if r.tenant == "prio"]
    cold = [r for r in wl.requests if r.tenant == "batch"]
    assert len({r.adapter for r in hot}) == 8 and len({r.adapter for r in cold}) == 40
    assert len(hot) / len(wl.requests) >= 0.8
    assert all(0.3 * 200 <= r.t_s < 0.5 * 200 for r in cold)
    uses = Counter(r.adapter for r in cold)
    assert set(uses.values()) <= {1, 2, 3}


def test_hot_one_shape() -> None:
    wl = w.generate("hot-one", 0, SMALL)
    hot = [r for r in wl.requests if r.tenant == w.HOT_ONE_TENANT]
    tail = Counter(r.adapter for r in wl.requests if r.tenant == w.HOT_ONE_TAIL_TENANT)
    assert {r.adapter for r in hot} == {"hot0000"}  # one revision
    assert len(hot) + sum(tail.values()) == len(wl.requests)
    assert len(hot) / len(wl.requests) == pytest.approx(w.HOT_ONE_SHARE, abs=0.02)
    assert len(wl.requests) / SMALL.duration_s == pytest.approx(SMALL.rate, rel=0.05)
    # The tail: zipf over the other num_adapters - 1 adapters, the first far above the 20th.
    assert len(wl.adapters) == SMALL.num_adapters and wl.adapters[0].name == "hot0000"
    ranked = tail.most_common()
    assert ranked[0][0] == "ad0000" and ranked[0][1] > 5 * ranked[20][1]
    # Hot and tail requests interleave throughout the run (no phases).
    for start in (0.0, 100.0):
        window = [r for r in wl.requests if start <= r.t_s < start + 100.0]
        share = sum(r.tenant == w.HOT_ONE_TENANT for r in window) / len(window)
        assert share == pytest.approx(w.HOT_ONE_SHARE, abs=0.04)
    with pytest.raises(ValueError, match="num_adapters"):
        w.generate("hot-one", 0, w.ScenarioParams(num_adapters=1))


def test_zipf_popularity_is_skewed_and_drift_rotates() -> None:
    wl = w.generate("zipf-longtail", 0, SMALL)
    counts = Counter(r.adapter for r in wl.requests).most_common()
    assert counts[0][0] == "ad0000" and counts[0][1] > 5 * counts[20][1]
    drift = w.generate("drift", 0, SMALL)
    phase = lambda i: Counter(  # noqa: E731
        r.adapter for r in drift.requests if i * 40 <= r.t_s < (i + 1) * 40
    ).most_common(1)[0][0]
    assert len({phase(i) for i in range(5)}) >= 3


def test_gamma_arrivals_rate_and_cv() -> None:
    rng = random.Random(0)
    for cv in (1.0, 3.0):
        times = w.gamma_arrivals(rng, 50.0, cv, 200.0)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        mean = sum(gaps) / len(gaps)
        std = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
        assert len(times) == pytest.approx(10_000, rel=0.1)
        assert std / mean == pytest.approx(cv, rel=0.15)


def test_popularity_helpers() -> None:
    assert w.zipf_weights(3, 1.0) == [1.0, 0.5, pytest.approx(1 / 3)]
    rng = random.Random(0)
    uniform = Counter(w.slora_power_index(rng, 4, 1.0) for _ in range(8000))
    skewed = Counter(w.slora_power_index(rng, 4, 0.3) for _ in range(8000))
    assert max(uniform.values()) < 1.15 * min(uniform.values())
    assert skewed[0] > 3 * skewed[3]
    assert w.assign_ranks(6, w.S2_RANKS) == [64, 32, 16, 8, 64, 32]


def test_bad_names_and_params() -> None:
    with pytest.raises(ValueError, match="unknown"):
        w.generate("nope")
    with pytest.raises(ValueError, match="rate"):
        w.ScenarioParams(rate=0)


def test_adapter_union_keeps_each_tenant_and_name_once_the_first_seen_in_order() -> None:
    a8, b8 = w.TraceAdapter("t", "a", 8, ()), w.TraceAdapter("t", "b", 8, ())
    a64, other = w.TraceAdapter("t", "a", 64, ()), w.TraceAdapter("u", "a", 8, ())
    assert w.adapter_union([(a8, b8), (a64, other), ()]) == (a8, b8, other)
    assert w.adapter_union([]) == ()
