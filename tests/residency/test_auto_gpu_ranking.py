"""The automatic GPU pins (at most ``max_auto_gpu``) go to the hottest revisions, not to the
first ones to qualify: a tenant trickling just enough requests to qualify must not hold every
automatic GPU slot while another tenant's far hotter adapter is refused one (before the fix:
first come, ties by key order, and an incumbent kept its pin until its own rate fell)."""

from __future__ import annotations

from cache_kit import key

from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.residency.warm import AutoWarmConfig, PinBook, RequestRates

CONFIG = AutoWarmConfig(gpu_rps=1.0, cpu_rps=0.1, hysteresis=0.5)
TRICKLE = [key("acme", f"t{i}") for i in range(2)]  # sorts before globex's key
HOT = key("globex", "hot")


def _rates(per_5m: float) -> RequestRates:
    return RequestRates(per_5m, per_5m, per_5m, per_5m)


def test_the_hottest_qualifying_revisions_win_the_seats() -> None:
    book = PinBook(CONFIG, max_auto_gpu=2)
    changes = book.rebalance({TRICKLE[0]: _rates(1.0), TRICKLE[1]: _rates(1.1), HOT: _rates(50)})
    assert changes[HOT] is WarmPolicy.GPU
    assert changes[TRICKLE[1]] is WarmPolicy.GPU  # the next hottest
    assert changes[TRICKLE[0]] is WarmPolicy.CPU


def test_a_far_hotter_revision_displaces_a_trickling_incumbent() -> None:
    book = PinBook(CONFIG, max_auto_gpu=2)
    book.rebalance({k: _rates(1.0) for k in TRICKLE})  # both seats, first come
    assert {book.warm_policy(k) for k in TRICKLE} == {WarmPolicy.GPU}
    # The incumbents keep just over the demotion bar (0.5); globex's adapter is far hotter.
    changes = book.rebalance({**{k: _rates(0.6) for k in TRICKLE}, HOT: _rates(50)})
    assert changes[HOT] is WarmPolicy.GPU
    assert [book.warm_policy(k) for k in TRICKLE].count(WarmPolicy.GPU) == 1
    assert [changes.get(k) for k in TRICKLE].count(WarmPolicy.CPU) == 1


def test_an_incumbent_keeps_its_seat_against_a_challenger_within_the_hysteresis() -> None:
    """A challenger must beat an incumbent's rate by the hysteresis factor (here 2x), so two
    revisions of similar rates do not trade the seat back and forth at every rebalance."""
    book = PinBook(CONFIG, max_auto_gpu=1)
    book.rebalance({HOT: _rates(1.0)})
    changes = book.rebalance({HOT: _rates(1.0), TRICKLE[0]: _rates(1.9)})
    assert book.warm_policy(HOT) is WarmPolicy.GPU and changes == {TRICKLE[0]: WarmPolicy.CPU}
    changes = book.rebalance({HOT: _rates(1.0), TRICKLE[0]: _rates(2.1)})
    assert changes == {HOT: WarmPolicy.CPU, TRICKLE[0]: WarmPolicy.GPU}
