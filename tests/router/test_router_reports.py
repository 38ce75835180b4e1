"""Replica reports: the JSON encoding round-trips, large sets become Bloom filters with a
bounded false-positive rate, and malformed reports are refused with the field named."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from router_kit import report

from loraplex.router import BloomFilter, MalformedReportError, decode_report, encode_report
from loraplex.router.reports import MAX_EXACT_KEYS


def _keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}/adapter-{i}@r{i % 7}#{i:064x}"[:120] for i in range(n)]


def test_report_round_trips_through_json() -> None:
    original = report(
        "replica-1",
        at_s=12.5,
        l0=["t/a@1"],
        l1=["t/a@1", "t/b@2"],
        l2=["t/c@3"],
        loading=["t/d@1"],
        pinned=["t/a@1"],
        merged=["t/a@1"],
        queued=3,
        running=5,
        tokens=900,
        kv=0.25,
        evictions=1.5,
    )
    wire = json.dumps(encode_report(original))
    assert decode_report(json.loads(wire)) == original


def test_small_sets_stay_exact_and_large_ones_become_bloom_filters() -> None:
    small = _keys("s", MAX_EXACT_KEYS)
    large = _keys("l", MAX_EXACT_KEYS + 1)
    encoded = encode_report(report("r", l0=small, l1=large))
    assert encoded["residency"]["l0"] == sorted(small)
    assert set(encoded["residency"]["l1"]) == {"bits", "num_bits", "num_hashes", "num_keys"}
    decoded = decode_report(json.loads(json.dumps(encoded)))
    assert isinstance(decoded.residency.l1, BloomFilter)
    assert len(decoded.residency.l1) == MAX_EXACT_KEYS + 1
    assert all(k in decoded.residency.l1 for k in large)  # never a false negative
    # Bloom filters make the report smaller than the list would.
    assert len(json.dumps(encoded["residency"]["l1"])) < len(json.dumps(large)) / 4


@pytest.mark.parametrize("rate", [0.01, 0.05])
def test_bloom_false_positive_rate_is_bounded(rate: float) -> None:
    members = _keys("m", 2000)
    bloom = BloomFilter.of(members, rate)
    assert all(k in bloom for k in members)
    strangers = _keys("x", 20000)
    false_positives = sum(k in bloom for k in strangers)
    # Twice the design rate: the hash is fixed, so this is deterministic, not flaky.
    assert false_positives / len(strangers) <= 2 * rate
    assert false_positives > 0  # the test can see false positives at all


def test_bloom_filter_refuses_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_bits"):
        BloomFilter(60, 3, bytes(8), 1)
    with pytest.raises(ValueError, match="bits has"):
        BloomFilter(64, 3, bytes(7), 1)
    with pytest.raises(ValueError, match="false_positive_rate"):
        BloomFilter.of(["a"], 0.0)


def _valid() -> dict[str, Any]:
    return encode_report(report("r1", at_s=1.0, l0=["t/a@1"], queued=1, kv=0.5))


def _mutate(path: list[str], value: object) -> dict[str, Any]:
    payload = copy.deepcopy(_valid())
    target = payload
    for part in path[:-1]:
        target = target[part]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return payload


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["v"], 1, "v"),  # an older version: no num_adapter_wait
        (["v"], 2, "v"),  # the previous version: no residency.merged
        (["v"], 4, "v"),
        (["v"], True, "v"),
        (["replica_id"], "", "replica_id"),
        (["replica_id"], 7, "replica_id"),
        (["at_s"], "soon", "at_s"),
        (["at_s"], float("nan"), "at_s"),
        (["load", "num_queued"], -1, "load.num_queued"),
        (["load", "num_queued"], 1.5, "load.num_queued"),
        (["load", "num_running"], True, "load.num_running"),
        (["load", "kv_usage"], 1.5, "load.kv_usage"),
        (["load", "evictions_per_min"], -0.1, "load.evictions_per_min"),
        (["load", "extra"], 1, "load.extra"),
        (["load", "num_active_tokens"], _DELETE, "load.num_active_tokens"),
        (["residency", "l3"], [], "residency.l3"),
        (["residency", "l0"], "t/a@1", "residency.l0"),
        (["residency", "l0"], [1, 2], "residency.l0"),
        (
            ["residency", "l1"],
            {"bits": "!!", "num_bits": 64, "num_hashes": 1, "num_keys": 1},
            "residency.l1",
        ),
        (
            ["residency", "l1"],
            {"bits": "AAAAAAAAAAA=", "num_bits": 64, "num_hashes": 0, "num_keys": 1},
            "residency.l1",
        ),
        (["residency", "l2"], {"bits": "AA=="}, "residency.l2.num_bits"),
        (["residency"], [], "residency"),
    ],
)
def test_malformed_reports_are_refused_naming_the_field(
    path: list[str], value: object, field: str
) -> None:
    with pytest.raises(MalformedReportError) as caught:
        decode_report(_mutate(path, value))
    assert caught.value.field == field


def test_non_object_payload_is_refused() -> None:
    with pytest.raises(MalformedReportError) as caught:
        decode_report([1, 2])
    assert caught.value.field == "report"


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ValueError, match="kv_usage"):
        report("r", kv=2.0)
    with pytest.raises(ValueError, match="replica_id"):
        report("")
