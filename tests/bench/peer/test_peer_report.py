"""``bench peer``'s figures without any server: the ABBA order over three kinds, null ratios,
failures at the timeout, each ratio's value and its min-max over rounds, the least favourable
setting, and the two base metrics (vLLM without LoRA, the best base of any kind)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from loraplex.bench.peer import bench as bench_module
from loraplex.bench.peer.bench import run_setting
from loraplex.bench.peer.client import BatchResult, Route, Shot
from loraplex.bench.peer.model import Lifetime, PeerBenchConfig, SettingRuns, Workloads
from loraplex.bench.peer.report import (
    headline_metrics,
    ratio,
    setting_metrics,
    side_stats,
    ttft_ms,
)
from loraplex.bench.peer.summary import summary_markdown
from loraplex.bench.peer.vllm import PeerSettings
from loraplex.bench.serve.driver import RequestRecord


def _record(ok: bool, ttft_s: float | None, tokens: int = 4) -> RequestRecord:
    status, error = (200, None) if ok else (0, "timeout")
    return RequestRecord(
        0.0, "t", "m", "L0", status, ttft_s, None, tokens if ok else 0, None, error
    )


def _batch(records: list[RequestRecord], wall_s: float = 2.0) -> BatchResult:
    return BatchResult(tuple(records), wall_s)


def _rate(tokens_per_s: float, ok: bool = True) -> BatchResult:
    return _batch([_record(ok, 0.01, tokens=int(tokens_per_s))], wall_s=1.0)


def _lifetime(
    label: str, *, adapter: float | None, base: float, first_s: float | None = 1.0,
    ttft_s: float | None = None, rss_mib: int = 100, ok: bool = True,
) -> Lifetime:  # fmt: skip
    trace = None if ttft_s is None else _batch([_record(True, ttft_s)])
    adapter_batch = None if adapter is None else _rate(adapter, ok)
    probes = ("a", "x") if adapter is not None else ()
    return Lifetime(label, first_s, probes, ("g",) if probes else (), adapter_batch,
                    _rate(base, ok), trace, rss_mib << 20)  # fmt: skip


# --- the order ------------------------------------------------------------------------------


class _Kind:
    def __init__(self, label: str, serves_adapters: bool) -> None:
        self.label, self.serves_adapters = label, serves_adapters

    @contextmanager
    def serving(self, data_dir: Path) -> Iterator[str]:
        yield "http://unused"

    def routes(self) -> tuple[Route, ...]:
        return ()

    def base_route(self) -> Route:
        return Route("base", "k")


def test_three_kinds_run_abba_and_the_trace_waits_for_both_capacities(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[str, bool, str]] = []

    def fake_lifetime(server: Any, plan: Workloads, data_dir: Path, config: Any,
                      trace: Sequence[Shot] | None) -> Lifetime:  # fmt: skip
        seen.append((server.label, trace is not None, data_dir.name))
        adapter = 10.0 if server.serves_adapters else None
        return _lifetime(server.label, adapter=adapter, base=20.0)

    monkeypatch.setattr(bench_module, "run_lifetime", fake_lifetime)
    kinds = (_Kind("loraplex", True), _Kind("vllm", True), _Kind("vllm-nolora", False))
    plan = Workloads(((0, "p", 4),), ("e",), (), (), (), ())
    config = PeerBenchConfig(rounds=3, trace_requests=4)
    runs = run_setting(kinds, PeerSettings(max_loras=4), plan, config, vocab=50, root=tmp_path)
    order = [label for label, _, _ in seen]
    assert order == ["loraplex", "vllm", "vllm-nolora", "vllm-nolora", "vllm", "loraplex",
                     "loraplex", "vllm", "vllm-nolora"]  # fmt: skip
    # the trace: once loraplex and vLLM (with LoRA) each had a first run
    assert [t for _, t, _ in seen] == [False, False, True, True, True, True, True, True, True]
    assert seen[0][2] == "run-0-loraplex" and seen[2][2] == "run-2-vllm-nolora"
    assert runs.labels == ("loraplex", "vllm", "vllm-nolora")
    assert runs.trace_rate == 0.5  # load x the slower capacity, 1 request/s
    with pytest.raises(ValueError, match="expected the first two to serve adapters"):
        run_setting(kinds[::-1], PeerSettings(max_loras=4), plan, config, vocab=50,
                    root=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match="two or three different kinds"):
        run_setting(kinds[:1] * 2, PeerSettings(max_loras=4), plan, config, vocab=50,
                    root=tmp_path)  # fmt: skip


# --- figures --------------------------------------------------------------------------------


def test_ratio_is_null_when_undefined_never_zero() -> None:
    assert ratio(2.0, 4.0) == 0.5
    assert ratio(None, 4.0) is None and ratio(2.0, None) is None
    assert ratio(2.0, 0.0) is None and ratio(0.0, 0.0) is None
    assert ratio(0.0, 3.0) == 0.0  # a real zero on top stays a zero


def test_failures_count_at_the_timeout_in_the_percentiles() -> None:
    done = [_record(True, 0.010) for _ in range(97)]
    failed = [_record(False, None), _record(False, None), _record(False, 0.5)]
    batch = _batch(done + failed)
    assert ttft_ms([batch], timeout_s=60.0, q=0.99) == 60_000.0
    assert ttft_ms([batch], timeout_s=60.0, q=0.5) == 10.0
    assert ttft_ms([_batch(done)], timeout_s=60.0, q=0.99) == 10.0
    assert ttft_ms([], timeout_s=60.0, q=0.99) is None
    assert batch.completed == 97 and batch.tokens_per_s == 97 * 4 / 2.0


def test_side_stats_count_a_failed_start_at_the_start_timeout() -> None:
    lifetimes = [_lifetime("vllm", adapter=10, base=10, first_s=30.0),
                 _lifetime("vllm", adapter=20, base=20, first_s=None)]  # fmt: skip
    stats = side_stats(lifetimes, ("a", "b"), timeout_s=60.0, start_timeout_s=600.0)
    assert stats["start_to_first_answer_s"] == 315.0  # median of 30 and 600 (the timeout)
    assert stats["first_answer_completed_ratio"] == 0.5
    assert stats["adapter_tokens_per_s"] == 15.0 and stats["adapter_completed_ratio"] == 1.0
    assert stats["probes_passed"] == 1  # "a" matches, "x" is not "b"
    assert stats["trace_p99_ttft_ms"] is None and stats["trace_completed_ratio"] is None
    assert stats["peak_rss_mib"] == 100.0 and stats["capacity_rps"] == 1.0
    unchecked = side_stats(lifetimes, ("a", None), timeout_s=60.0, start_timeout_s=600.0)
    assert unchecked["probes_passed"] == 1  # an unchecked probe never passes
    base_only = side_stats([_lifetime("n", adapter=None, base=30)], (), 60.0, 600.0)
    assert base_only["adapter_tokens_per_s"] is None and base_only["capacity_rps"] is None
    assert base_only["probes_passed"] is None and base_only["base_tokens_per_s"] == 30.0


def _three_kinds(
    rounds: list[tuple[float, float, float, float, float]],
    labels: tuple[str, ...] = ("loraplex", "vllm", "vllm-nolora"),
) -> SettingRuns:
    """Per round: loraplex adapter and base, vLLM adapter and base, vLLM-no-LoRA base."""
    lifetimes = []
    for i, (la, lb, va, vb, nb) in enumerate(rounds):
        ttft = None if i == 0 else 0.01 * (i + 1)  # round 0 ran no trace
        lifetimes += [
            _lifetime("loraplex", adapter=la, base=lb, first_s=2.0, ttft_s=ttft, rss_mib=100),
            _lifetime("vllm", adapter=va, base=vb, first_s=20.0, ttft_s=0.1, rss_mib=400),
        ]
        if len(labels) == 3:
            lifetimes.append(_lifetime("vllm-nolora", adapter=None, base=nb, first_s=30.0))
    return SettingRuns(PeerSettings(max_loras=16), labels, tuple(lifetimes), 2.0, ("a", "b"))


def test_each_ratio_is_the_ratio_of_medians_with_its_min_and_max_over_rounds() -> None:
    runs = _three_kinds([(500, 1000, 100, 800, 1200), (600, 1100, 120, 1000, 1000),
                         (400, 900, 80, 900, 1500)])  # fmt: skip
    s = setting_metrics(runs, timeout_s=60.0, start_timeout_s=600.0)
    assert s["rounds"] == 3
    assert s["adapter_throughput_over_vllm"] == 5.0  # median 500 / median 100
    assert (s["adapter_throughput_over_vllm_min"], s["adapter_throughput_over_vllm_max"]) == (
        5.0, 5.0)  # fmt: skip
    assert s["base_throughput_over_vllm"] == round(1000 / 900, 3)
    assert s["base_throughput_over_vllm_min"] == 1.0  # 900 / 900
    assert s["base_throughput_over_vllm_max"] == 1.25  # 1000 / 800
    assert s["base_throughput_over_vllm_nolora"] == round(1000 / 1200, 3)
    assert s["base_throughput_over_vllm_nolora_min"] == 0.6  # 900 / 1500
    assert s["base_throughput_over_vllm_nolora_max"] == 1.1  # 1100 / 1000
    # loraplex's adapter batch over the best base of any kind (medians per kind: 1000, 900,
    # 1200); per round the largest of the three
    assert s["adapter_traffic_over_best_base"] == round(500 / 1200, 3)
    assert s["adapter_traffic_over_best_base_min"] == round(400 / 1500, 3)
    assert s["adapter_traffic_over_best_base_max"] == round(600 / 1100, 3)
    # the trace ran from round 1 on: round 0 is left out of its spread
    assert s["common_rate_p99_ttft_over_vllm_min"] == 0.2
    assert s["common_rate_p99_ttft_over_vllm_max"] == 0.3
    # the per-round ratios' median beside them (the value pools or takes medians per kind)
    assert s["base_throughput_over_vllm_median"] == 1.1  # of 1.25, 1.1, 1.0 (the value: 1.111)
    assert s["base_throughput_over_vllm_nolora_median"] == 0.833  # 0.833, 1.1, 0.6
    assert s["common_rate_p99_ttft_over_vllm_median"] == 0.25  # 0.2, 0.3
    assert s["start_to_first_answer_over_vllm"] == 0.1 and s["peak_rss_over_vllm"] == 0.25
    assert s["vllm_nolora"]["base_tokens_per_s"] == 1200 and s["vllm_nolora"]["lifetimes"] == 3
    assert s["probes"] == 2 and s["greedy_matched"] == 1


def test_a_failed_kind_makes_its_ratios_null_never_flattering() -> None:
    failed_base = _three_kinds([(500, 1000, 100, 800, 1200), (600, 1100, 120, 900, 0)])
    s = setting_metrics(failed_base, timeout_s=60.0, start_timeout_s=600.0)
    # vLLM without LoRA completed nothing in round 1: its ratio's spread is undefined, and the
    # best base is unknown rather than the others' smaller one
    assert s["base_throughput_over_vllm_nolora_min"] is None
    assert s["adapter_traffic_over_best_base_min"] is None
    assert s["base_throughput_over_vllm_nolora"] == round(1050 / 600, 3)  # median of 1200, 0
    assert s["base_throughput_over_vllm"] == round(1050 / 850, 3)  # unaffected
    all_failed = _three_kinds([(500, 1000, 100, 800, 0), (600, 1100, 120, 900, 0)])
    t = setting_metrics(all_failed, timeout_s=60.0, start_timeout_s=600.0)
    assert t["base_throughput_over_vllm_nolora"] is None
    assert t["adapter_traffic_over_best_base"] is None
    two = setting_metrics(_three_kinds([(500, 1000, 100, 800, 0)], labels=("loraplex", "vllm")),
                          timeout_s=60.0, start_timeout_s=600.0)  # fmt: skip
    assert "vllm_nolora" not in two and two["base_throughput_over_vllm_nolora"] is None
    assert two["adapter_traffic_over_best_base"] is None  # a kind that did not run: unknown
    assert two["base_throughput_over_vllm"] == 1.25


def test_headline_is_the_least_favourable_setting_with_its_spread() -> None:
    eight = setting_metrics(_three_kinds([(600, 1000, 100, 800, 1200)] * 2), 60.0, 600.0)
    sixteen = setting_metrics(_three_kinds([(550, 1000, 100, 800, 1200),
                                            (500, 1000, 100, 800, 1200)]), 60.0, 600.0)  # fmt: skip
    eight["max_loras"] = 8
    metrics = headline_metrics([eight, sixteen])
    assert metrics["adapter_throughput_over_vllm"] == 5.25  # higher is better: the smaller
    assert metrics["adapter_throughput_over_vllm_min"] == 5.0
    assert metrics["adapter_throughput_over_vllm_max"] == 5.5
    detail = metrics["adapter_throughput"]
    assert detail["max_loras"] == 16 and detail["loraplex"] == 525.0 and detail["vllm"] == 100
    assert detail["completed_ratio_vllm"] == 1.0
    assert metrics["adapter_traffic_over_best_base"] == round(525 / 1200, 3)
    assert metrics["adapter_traffic_over_best_base_max"] == round(550 / 1200, 3)
    behind = metrics["adapter_traffic_best_base"]
    assert behind["loraplex"] == 525.0 and behind["vllm_nolora_base"] == 1200
    assert behind["loraplex_base"] == 1000 and behind["completed_ratio_vllm_base"] == 1.0
    assert metrics["base_throughput_vllm_nolora"]["vllm_nolora"] == 1200
    assert set(metrics["per_max_loras"]) == {"8", "16"} and metrics["rounds"] == 2
    undefined = dict(eight, adapter_throughput_over_vllm=None)
    nulled = headline_metrics([undefined, sixteen])
    assert nulled["adapter_throughput_over_vllm"] is None
    assert nulled["adapter_throughput_over_vllm_min"] is None
    assert nulled["adapter_throughput_over_vllm_median"] is None
    text = summary_markdown(metrics, "stand-in")
    assert metrics["adapter_throughput_over_vllm_median"] == 5.25
    assert "vllm_nolora" in text and "5.25 (5.0-5.5, per-round median 5.25)" in text
