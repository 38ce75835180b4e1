"""``scripts/sim-timeline/fleet_in_flight.py``: a real fleet run's requests by the others
decoding and waiting (simfleet, docs/simulator.md "Fleet hot-burst on Milan")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "sim-timeline"


def _record(t: float, ttft: float, tpot: float | None, tier: str = "L0") -> dict[str, object]:
    return {"t_s": t, "ttft_s": ttft, "tpot_s": tpot, "completion_tokens": 5, "tier": tier}


def test_spans_end_after_the_tokens_and_a_failed_request_is_left_out() -> None:
    sys.path.insert(0, str(SCRIPTS))
    from fleet_in_flight import real_spans

    spans = real_spans([_record(1.0, 0.1, 0.02), _record(2.0, 0.1, None)])
    assert len(spans) == 1
    assert spans[0].first_s == pytest.approx(1.1) and spans[0].end_s == pytest.approx(1.18)
    assert spans[0].tpot_ms == pytest.approx(20.0)


def test_counts_split_the_others_into_decoding_and_waiting() -> None:
    sys.path.insert(0, str(SCRIPTS))
    from fleet_in_flight import decode_counts, real_spans

    # the first decodes over [0.1, 0.9]; at its middle (0.5) the second decodes (first token
    # 0.3), the third waits (arrived 0.4, first token 1.0), the fourth has not arrived
    records = [_record(0.0, 0.1, 0.2), _record(0.2, 0.1, 0.2), _record(0.4, 0.6, 0.2)]
    records.append(_record(2.0, 0.1, 0.2))
    counts = decode_counts(real_spans(records))
    assert counts[0] == (1, 1, pytest.approx(200.0))
    assert counts[3][:2] == (0, 0)


def test_the_fit_recovers_a_plane_and_refuses_counts_that_do_not_vary() -> None:
    sys.path.insert(0, str(SCRIPTS))
    from fleet_in_flight import least_squares

    rows = [(d, w, 10.0 + 5.0 * d + 4.0 * w) for d in range(4) for w in range(3)]
    assert least_squares(rows) == pytest.approx((10.0, 5.0, 4.0))
    with pytest.raises(ValueError, match="least_squares"):
        least_squares([(1, 1, 10.0), (1, 1, 12.0)])


def test_warm_requests_are_bucketed_by_the_others_in_flight_at_arrival() -> None:
    sys.path.insert(0, str(SCRIPTS))
    from fleet_in_flight import real_spans, warm_by_arrival

    records = [_record(0.0, 0.05, 0.01, "L3"), _record(0.01, 0.03, 0.01)]
    records.append(_record(5.0, 0.02, 0.01))
    table = warm_by_arrival(real_spans(records))
    assert table["0-1"] == (2, pytest.approx(15.0), pytest.approx(10.0))  # 30-10, 20-10 ms
    assert table["13+"] == (0, None, None)
