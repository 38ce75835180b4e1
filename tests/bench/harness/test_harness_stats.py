"""bench/harness: the undefined-ratio rule, failures at the timeout, nearest-rank
percentiles, the ABBA order and the machine record."""

from __future__ import annotations

from pathlib import Path

from loraplex.bench.harness.machine import cpu_description, machine_record
from loraplex.bench.harness.order import run_order
from loraplex.bench.harness.stats import at_timeout, nearest_rank, ratio


def test_ratio_is_null_never_zero_when_undefined() -> None:
    assert ratio(1.0, 3.0) == 0.333
    assert ratio(1.0, 3.0, None) == 1.0 / 3.0
    assert ratio(1.0, 3.0, 1) == 0.3
    assert ratio(0.0, 2.0) == 0.0  # a defined zero stays zero
    for num, den in ((1.0, 0.0), (1.0, -1.0), (None, 1.0), (1.0, None), (None, None)):
        assert ratio(num, den) is None


def test_failures_count_at_least_the_timeout() -> None:
    assert at_timeout(True, 0.2, 30.0) == 0.2
    assert at_timeout(False, 0.2, 30.0) == 30.0  # failed fast: not faster than the bound
    assert at_timeout(False, 45.0, 30.0) == 45.0  # failed late: as late as it was
    assert at_timeout(True, None, 30.0) == 30.0  # completed without a first token
    assert at_timeout(False, None, 30.0) == 30.0


def test_nearest_rank() -> None:
    assert nearest_rank([], 0.5) is None
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0
    assert nearest_rank([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert nearest_rank([7.0], 0.99) == 7.0


def test_run_order_alternates_abba_then_baab() -> None:
    assert run_order([2], 4) == [(0, 0), (0, 1), (0, 1), (0, 0), (0, 0), (0, 1), (0, 1), (0, 0)]
    assert run_order([2, 2], 1) == [(0, 0), (0, 1), (1, 1), (1, 0)]
    assert run_order([3], 2) == [(0, 0), (0, 1), (0, 2), (0, 2), (0, 1), (0, 0)]


def test_machine_record(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Test CPU\nflags\t\t: fpu avx2 avx512f sse\n")
    unknown = {"vendor": None, "family": None, "model_id": None}
    assert cpu_description(info) == {"model": "Test CPU", "isa": ["avx2", "avx512f"], **unknown}
    assert cpu_description(tmp_path / "missing") == {"model": "unknown", "isa": [], **unknown}
    record = machine_record()
    assert set(record) == {"cpu", "cores", "load_1m", "python"}
    assert record["cores"] >= 1 and record["python"].count(".") == 2
