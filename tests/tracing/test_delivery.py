"""``SpanLedger``: each span handed to the processor ends in exactly one count; spans still
waiting at shutdown are counted lost and never sent afterwards."""

from __future__ import annotations

from loraplex.tracing.delivery import SpanLedger


def test_spans_past_the_queue_are_refused_and_counted() -> None:
    ledger = SpanLedger(max_waiting=3)
    assert [ledger.admit() for _ in range(5)] == [True, True, True, False, False]
    assert ledger.take(2)  # the exporter took a batch: room for two more
    assert ledger.admit() and ledger.admit() and not ledger.admit()
    ledger.settle(2, delivered=True)
    assert ledger.exported() == 2
    assert ledger.dropped() == {"queue_full": 3, "export_failed": 0, "shutdown": 0}


def test_a_failed_batch_is_counted() -> None:
    ledger = SpanLedger(max_waiting=8)
    for _ in range(4):
        ledger.admit()
    assert ledger.take(4)
    ledger.settle(4, delivered=False)
    assert ledger.exported() == 0 and ledger.dropped()["export_failed"] == 4


def test_spans_waiting_at_shutdown_are_lost_once() -> None:
    ledger = SpanLedger(max_waiting=8)
    for _ in range(5):
        ledger.admit()
    assert ledger.take(2)  # a batch in export when the shutdown gave up: settled by its export
    assert ledger.close() == 3  # still waiting: lost
    assert not ledger.take(3)  # popped after the shutdown: counted already, not sent
    assert not ledger.admit()  # handed after the shutdown
    ledger.settle(2, delivered=True)
    assert ledger.exported() == 2
    assert ledger.dropped() == {"queue_full": 0, "export_failed": 0, "shutdown": 4}
