"""The execution benchmark runs end to end in a tiny configuration with the documented shape."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.bench.execution.bench import (
    Case,
    ExecutionBenchConfig,
    run_execution_bench,
    seq_slots,
)
from loraplex.bench.execution.timing import interleaved_medians
from loraplex.cli import app


def test_tiny_run_has_the_documented_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loraplex.bench.execution.setup as setup

    monkeypatch.setattr(
        setup, "RANK_MIXES", {"all-8": (8,), "all-16": (16,), "S2": (64, 32, 16, 8)}
    )
    config = ExecutionBenchConfig(
        dtypes=("float32",), rounds=1, calls_per_round=1, context_tokens=4,
        matrix_axes={"popularity": ("zipf",), "tokens": ("prefill-64",)},
    )  # fmt: skip
    from loraplex.model.llama import ForwardBatch

    builds = {"count": 0}
    real_build = ForwardBatch.build

    def counting_build(*args: object, **kwargs: object) -> object:
        builds["count"] += 1
        return real_build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ForwardBatch, "build", counting_build)
    result = run_execution_bench(config, workdir=tmp_path)
    line = json.loads(json.dumps({k: result[k] for k in ("name", "config", "seed", "metrics")}))
    assert line["name"] == "execution" and line["seed"] == 0
    # The server's KV cache was measured, and both sides timed their input preparation.
    assert line["config"]["kv_cache"] == "paged" and line["config"]["kv_block_size"] == 16
    assert line["config"]["batch_build_timed"] is True
    # glibc (this machine's C library) accepts the server's malloc thresholds
    assert line["config"]["heap_kept"] is True
    assert builds["count"] > 0  # ForwardBatch.build ran inside the timed steps
    metrics = line["metrics"]
    for key in (
        "mixed_over_base",
        "single_over_base",
        "mixed_over_peft",
        "bytes_floor",
        "prefill_mixed_over_base",
        "mixed_loop_over_base",
        "mixed_padded_over_base",
        "mixed_r16_over_base",
        "mixed_r16_grouped_over_base",
        "bytes_floor_r16",
    ):
        assert isinstance(metrics[key], float) and metrics[key] > 0, key
    # 16 rank-16 adapters move fewer bytes than the S2 mix (ranks 64/32/16/8, mean 30).
    assert 0 < metrics["bytes_floor"] < metrics["bytes_floor_r16"] < 1
    rows = result["rows"]
    assert isinstance(rows, list)
    matrix = [r for r in rows if r["section"] == "matrix"]
    assert {(r["popularity"], r["step"]) for r in matrix} == {
        ("distinct", "decode"),
        ("zipf", "decode"),
        ("distinct", "prefill-64"),
    }
    assert {r["variant"] for r in matrix} == {"base", "single", "mixed"}
    assert list(tmp_path.iterdir()) == []  # the workspace is removed


def test_cli_prints_one_json_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loraplex.bench.execution.bench as execution

    def tiny(config: ExecutionBenchConfig, workdir: Path | None = None) -> dict[str, object]:
        assert config.matrix is False and config.dtypes == ("float32",)
        return {"name": "execution", "config": {}, "seed": 0, "rows": [],
                "metrics": {"mixed_over_base": 0.5, "bytes_floor": 0.5}}  # fmt: skip

    monkeypatch.setattr(execution, "run_execution_bench", tiny)
    out = CliRunner().invoke(app, ["bench", "execution", "--quick", "--json",
                                   "--report-dir", str(tmp_path)])  # fmt: skip
    assert out.exit_code == 0, out.output
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and json.loads(lines[0])["metrics"]["mixed_over_base"] == 0.5
    assert (tmp_path / "execution-run.md").is_file() and (tmp_path / "execution.png").is_file()


def test_quick_takes_an_explicit_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """--quick means 3 rounds, but a --rounds given beside it is used, not silently dropped."""
    import loraplex.bench.execution.bench as execution

    seen: list[int] = []

    def tiny(config: ExecutionBenchConfig, workdir: Path | None = None) -> dict[str, object]:
        seen.append(config.rounds)
        return {"name": "execution", "config": {}, "seed": 0, "rows": [], "metrics": {}}

    monkeypatch.setattr(execution, "run_execution_bench", tiny)
    for extra, rounds in (([], 3), (["--rounds", "6"], 6)):
        out = CliRunner().invoke(app, ["bench", "execution", "--quick", "--json",
                                       "--report-dir", "", *extra])  # fmt: skip
        assert out.exit_code == 0, out.output
        assert seen[-1] == rounds


def test_popularity_patterns() -> None:
    rng = random.Random(0)
    assert seq_slots(Case(popularity="identical"), 4, rng) == [0, 0, 0, 0]
    assert seq_slots(Case(active=4, popularity="distinct"), 6, rng) == [0, 1, 2, 3, 0, 1]
    zipf = seq_slots(Case(active=16, popularity="zipf"), 2000, rng)
    assert zipf.count(0) > zipf.count(1) > zipf.count(8) and max(zipf) < 16
    assert Case(batch_size=32).shape(8).batch_size == 32


def test_interleaved_medians_calls_each_variant() -> None:
    calls = {"a": 0, "b": 0}

    def bump(name: str) -> None:
        calls[name] += 1

    seconds = interleaved_medians({"a": lambda: bump("a"), "b": lambda: bump("b")},
                                  rounds=3, calls_per_round=2, warmup_calls=1)  # fmt: skip
    assert calls == {"a": 7, "b": 7} and set(seconds) == {"a", "b"}
    order: list[str] = []
    interleaved_medians({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                        rounds=4, calls_per_round=1, warmup_calls=0)  # fmt: skip
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]  # ABBA
    with pytest.raises(ValueError, match="rounds"):
        interleaved_medians({}, rounds=0, calls_per_round=1)


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="dtypes"):
        ExecutionBenchConfig(dtypes=("float64",))
    with pytest.raises(ValueError, match="rounds"):
        ExecutionBenchConfig(rounds=0)


def test_device_and_backend_are_validated() -> None:
    with pytest.raises(ValueError, match="device 'tpu'"):
        ExecutionBenchConfig(device="tpu")
    with pytest.raises(ValueError, match="backend 'fast'"):
        ExecutionBenchConfig(backend="fast")
    with pytest.raises(ValueError, match="batch_size"):
        ExecutionBenchConfig(batch_size=0)


def test_cuda_without_a_device_is_refused_by_name(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the refusal without CUDA")
    out = CliRunner().invoke(app, ["bench", "execution", "--quick", "--device", "cuda",
                                   "--report-dir", str(tmp_path)])  # fmt: skip
    assert out.exit_code == 2 and "torch sees no CUDA device" in out.output


def test_sync_brackets_every_timed_block() -> None:
    events: list[str] = []
    interleaved_medians({"a": lambda: events.append("call")}, rounds=2, calls_per_round=2,
                        warmup_calls=1, sync=lambda: events.append("sync"))  # fmt: skip
    assert events == ["call"] + ["sync", "call", "call", "sync"] * 2
